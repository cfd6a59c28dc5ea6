//! `ai_extract`: several texts about one document, one per field (the call's
//! labels name the fields, its descriptions hold their questions), each
//! decoded after the document's shared KV.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StringBuilder, StructArray};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field};
use sha2::{Digest, Sha256};

use super::{AnswerKind, ModelReading, SampleSoFar, hash_words, wrong};
use crate::error::Result;
use crate::inference::call::{AiCall, Answer};
use crate::inference::prompt::{EXTRACT_SEPARATOR, PromptFormat, PromptPieces, extract_questions};

/// See the module header.
#[derive(Debug)]
pub struct Extract;

impl AnswerKind for Extract {
    fn name(&self) -> &'static str {
        "extract"
    }

    fn generates(&self) -> bool {
        true
    }

    fn asks_per_field(&self) -> bool {
        true
    }

    /// A struct of one text per field, named by `fields`.
    fn return_type(&self, fields: &[String], _size: u32) -> DataType {
        DataType::Struct(
            fields
                .iter()
                .map(|f| Field::new(f, DataType::Utf8, true))
                .collect(),
        )
    }

    fn fits(&self, answer: &Answer, labels: usize, _size: u32) -> bool {
        matches!(answer, Answer::Fields(f) if f.len() == labels)
    }

    fn cache_code(&self) -> u8 {
        b'x'
    }

    fn answer_column(&self) -> &'static str {
        "fields"
    }

    fn projection_node(&self) -> &'static str {
        "AiExtract"
    }

    /// The document alone: each field's question follows it.
    fn pieces(
        &self,
        format: PromptFormat,
        _template: &str,
        _pair: bool,
        _labels: &[String],
        _descriptions: &[String],
    ) -> Result<PromptPieces> {
        Ok(PromptPieces {
            preamble: format.preamble().to_string(),
            frame: String::new(),
            label: String::new(),
            tail: EXTRACT_SEPARATOR.to_string(),
            pair: false,
        })
    }

    /// The questions travel rendered: each is what the model reads after the
    /// document.
    fn travelling_descriptions(
        &self,
        format: PromptFormat,
        descriptions: &[String],
    ) -> Vec<String> {
        extract_questions(format, descriptions)
    }

    fn column(
        &self,
        labels: &[String],
        _size: u32,
        answers: &[Option<&Answer>],
    ) -> Result<ArrayRef> {
        let mut columns: Vec<StringBuilder> = labels.iter().map(|_| StringBuilder::new()).collect();
        let mut valid = Vec::with_capacity(answers.len());
        for a in answers {
            match a {
                None => {
                    columns.iter_mut().for_each(StringBuilder::append_null);
                    valid.push(false);
                }
                Some(Answer::Fields(f)) if f.len() == labels.len() => {
                    for (c, text) in columns.iter_mut().zip(f.iter()) {
                        c.append_value(text);
                    }
                    valid.push(true);
                }
                Some(other) => return Err(wrong(self, other)),
            }
        }
        let DataType::Struct(fields) = self.return_type(labels, 0) else {
            unreachable!("an extraction is a struct");
        };
        let arrays: Vec<ArrayRef> = columns
            .iter_mut()
            .map(|c| Arc::new(c.finish()) as ArrayRef)
            .collect();
        Ok(Arc::new(StructArray::try_new(
            fields,
            arrays,
            Some(NullBuffer::from(valid)),
        )?))
    }

    fn reading(&self) -> ModelReading {
        ModelReading::FieldTexts
    }

    /// Empty texts: no sample can say where a text would end.
    fn drawn(&self, call: &AiCall, _sample: SampleSoFar<'_>, _u: f64) -> Answer {
        Answer::Fields(vec!["".into(); call.labels.len()].into())
    }

    /// Each field's text names the prompt's hash mixed with its question.
    fn hashed(&self, call: &AiCall, h: u64) -> Answer {
        Answer::Fields(
            call.descriptions
                .iter()
                .map(|q| {
                    let digest = Sha256::new()
                        .chain_update(h.to_le_bytes())
                        .chain_update(q.as_bytes())
                        .finalize();
                    let field = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
                    hash_words(field, call.max_tokens)
                })
                .collect(),
        )
    }
}
