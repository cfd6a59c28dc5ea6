//! `ai_extract`: several answers about one document, one per field (the
//! call's labels declare the fields, `name` or `name TYPE`
//! ([`FieldDecl`]), its descriptions hold their questions), each decoded
//! after the document's shared KV; a typed field's text is decoded in its
//! type's grammar and read as a value of it.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StructArray};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field};
use sha2::{Digest, Sha256};

use super::{AnswerKind, ModelReading, SampleSoFar, hash_words, wrong};
use crate::error::{EngineError, Result};
use crate::inference::call::{AiCall, Answer};
use crate::inference::field_type::{FieldDecl, FieldType};
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

    /// A struct of one value per field, named and typed by the `fields`'
    /// declarations.
    fn return_type(&self, fields: &[String], _size: u32) -> DataType {
        DataType::Struct(
            declarations(fields)
                .iter()
                .map(|d| Field::new(&d.name, d.ty.data_type(), true))
                .collect(),
        )
    }

    /// One text per field, each an answer of its field's type.
    fn fits(&self, answer: &Answer, labels: &[String], _size: u32) -> bool {
        matches!(answer, Answer::Fields(f) if f.len() == labels.len()
            && declarations(labels).iter().zip(f.iter()).all(|(d, t)| d.ty.accepts(t)))
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
        let mut texts: Vec<Vec<Option<&str>>> = labels
            .iter()
            .map(|_| Vec::with_capacity(answers.len()))
            .collect();
        let mut valid = Vec::with_capacity(answers.len());
        for a in answers {
            match a {
                None => {
                    texts.iter_mut().for_each(|c| c.push(None));
                    valid.push(false);
                }
                Some(Answer::Fields(f)) if f.len() == labels.len() => {
                    for (c, text) in texts.iter_mut().zip(f.iter()) {
                        c.push(Some(text));
                    }
                    valid.push(true);
                }
                Some(other) => return Err(wrong(self, other)),
            }
        }
        let DataType::Struct(fields) = self.return_type(labels, 0) else {
            unreachable!("an extraction is a struct");
        };
        let arrays = declarations(labels)
            .iter()
            .zip(&texts)
            .map(|(d, texts)| {
                d.ty.column(texts).map_err(|e| {
                    EngineError::Inference(format!("field {} of an extraction: {e}", d.name))
                })
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        Ok(Arc::new(StructArray::try_new(
            fields,
            arrays,
            Some(NullBuffer::from(valid)),
        )?))
    }

    fn reading(&self) -> ModelReading {
        ModelReading::FieldTexts
    }

    /// Empty texts (no sample can say where a text would end), and a value
    /// of its type for a typed field.
    fn drawn(&self, call: &AiCall, _sample: SampleSoFar<'_>, u: f64) -> Answer {
        let h = (u * 2f64.powi(53)) as u64;
        Answer::Fields(
            declarations(&call.labels)
                .iter()
                .map(|d| d.ty.example(h).unwrap_or_default().into())
                .collect(),
        )
    }

    /// Each field's text names the prompt's hash mixed with its question.
    fn hashed(&self, call: &AiCall, h: u64) -> Answer {
        Answer::Fields(
            call.descriptions
                .iter()
                .zip(declarations(&call.labels).iter())
                .map(|(q, d)| {
                    let digest = Sha256::new()
                        .chain_update(h.to_le_bytes())
                        .chain_update(q.as_bytes())
                        .finalize();
                    let field = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
                    match d.ty.example(field) {
                        Some(value) => value.into(),
                        None => hash_words(field, call.max_tokens),
                    }
                })
                .collect(),
        )
    }
}

/// The fields' declarations; a label that is not one (no call the planner
/// made has such) is a text field named by the whole label. Every answer's
/// check reads them, and a field over a column's keys spells them all, so
/// the last few label sets' declarations are kept, by a hash of the labels.
pub fn declarations(labels: &[String]) -> Arc<[FieldDecl]> {
    kept_declarations(labels, "")
}

/// [`declarations`] of `labels` each read after `prefix` (a generating
/// call's type is read as `answer {type}`), kept by a hash of both.
pub(super) fn kept_declarations(labels: &[String], prefix: &str) -> Arc<[FieldDecl]> {
    static KEPT: std::sync::Mutex<Option<HashMap<u128, Arc<[FieldDecl]>>>> =
        std::sync::Mutex::new(None);
    const MOST_KEPT: usize = 64;
    let mut hasher = twox_hash::XxHash3_128::new();
    for l in std::iter::once(prefix).chain(labels.iter().map(String::as_str)) {
        hasher.write(&(l.len() as u64).to_le_bytes());
        hasher.write(l.as_bytes());
    }
    let key = hasher.finish_128();
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let kept = kept.get_or_insert_with(HashMap::new);
    if let Some(d) = kept.get(&key) {
        return d.clone();
    }
    let parsed: Arc<[FieldDecl]> = labels
        .iter()
        .map(|l| {
            FieldDecl::parse(&format!("{prefix}{l}")).unwrap_or_else(|_| FieldDecl {
                name: l.clone(),
                ty: FieldType::Text,
            })
        })
        .collect();
    if kept.len() >= MOST_KEPT {
        kept.clear();
    }
    kept.insert(key, parsed.clone());
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker's or a cache's texts are checked against the fields' types:
    /// a text that is not a value of its type is refused, never read.
    #[test]
    fn answers_fit_only_with_values_of_their_types() {
        let labels: Vec<String> = vec!["year INT".into(), "note".into()];
        let fields = |a: &str, b: &str| Answer::Fields(vec![a.into(), b.into()].into());
        assert!(Extract.fits(&fields("1999", "anything"), &labels, 8));
        assert!(Extract.fits(&fields(" -3", ""), &labels, 8));
        assert!(!Extract.fits(&fields("nineteen", "x"), &labels, 8));
        assert!(!Extract.fits(&fields("1999", "x"), &labels[..1], 8));
        let e = Extract
            .column(&labels, 8, &[Some(&fields("12x", "x"))])
            .unwrap_err();
        assert!(e.to_string().contains("field year"), "{e}");
    }
}
