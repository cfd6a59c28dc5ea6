//! `ai_embed`: a text's embedding as Qwen3-Embedding computes it. The prompt
//! is the text (a document) or `Instruct: {instruction}\nQuery:{text}` (a
//! query), ended by `<|endoftext|>`; the answer is the final hidden state
//! (after the final norm, no output head) of that last position, its first
//! `dims` components L2-normalised (Matryoshka truncation: the prefix of the
//! full vector, renormalised). The instruction travels as the call's template
//! and `dims` as its `max_tokens`, so the answer cache and the query's memo
//! key both, and the instruction is the prompt's preamble: computed once and
//! shared by every text, as a document prefix is.
//!
//! An empty text is embedded like any other: its prompt is the instruction
//! prefix (if any) and `<|endoftext|>`, a defined vector.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, FixedSizeListArray, Float32Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field};

use super::{AnswerKind, ModelReading, SampleSoFar, wrong};
use crate::error::{EngineError, Result};
use crate::inference::call::{AiCall, Answer};
use crate::inference::prompt::{PromptFormat, PromptPieces};

/// The token Qwen3-Embedding ends every text with; its position is pooled.
const END_OF_TEXT: &str = "<|endoftext|>";

/// See the module header.
#[derive(Debug)]
pub struct Embed;

/// The pieces of an embedding prompt: the instruction prefix (none for an
/// empty instruction: a document is embedded bare) and the closing token.
/// Embeddings ignore the chat format: the model reads plain text.
pub fn embedding_pieces(instruction: &str) -> PromptPieces {
    PromptPieces {
        preamble: if instruction.is_empty() {
            String::new()
        } else {
            format!("Instruct: {instruction}\nQuery:")
        },
        frame: String::new(),
        label: String::new(),
        tail: END_OF_TEXT.to_string(),
        pair: false,
    }
}

/// The embedding of `dims` components from a final hidden state: its first
/// `dims` values divided by their L2 norm (computed in f64). An error when
/// the state is shorter than `dims`, or the prefix is zero or not finite
/// (no direction to normalise).
pub fn embedding_of(hidden: &[f32], dims: u32) -> std::result::Result<Box<[f32]>, String> {
    let dims = dims as usize;
    if dims == 0 || dims > hidden.len() {
        return Err(format!(
            "an embedding of {dims} dimensions was asked of a hidden state of {}",
            hidden.len()
        ));
    }
    let prefix = &hidden[..dims];
    let norm = prefix
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if !(norm.is_finite() && norm > 0.0) {
        return Err(format!(
            "the hidden state's first {dims} components have norm {norm}: no direction to \
             normalise"
        ));
    }
    Ok(prefix
        .iter()
        .map(|&x| (f64::from(x) / norm) as f32)
        .collect())
}

/// The Arrow type of an embedding of `dims` components.
fn vector_type(dims: u32) -> DataType {
    DataType::FixedSizeList(
        Arc::new(Field::new_list_field(DataType::Float32, true)),
        dims as i32,
    )
}

impl AnswerKind for Embed {
    fn name(&self) -> &'static str {
        "embed"
    }

    fn documents(&self) -> Option<usize> {
        Some(1)
    }

    fn return_type(&self, _fields: &[String], size: u32) -> DataType {
        vector_type(size)
    }

    fn keys_max_tokens(&self) -> bool {
        true
    }

    fn fits(&self, answer: &Answer, _labels: &[String], size: u32) -> bool {
        matches!(answer, Answer::Vector(v)
            if v.len() == size as usize && v.iter().all(|x| x.is_finite()))
    }

    fn cache_code(&self) -> u8 {
        b'e'
    }

    fn answer_column(&self) -> &'static str {
        "embedding"
    }

    fn projection_node(&self) -> &'static str {
        "AiEmbed"
    }

    /// The template is the instruction.
    fn pieces(
        &self,
        _format: PromptFormat,
        template: &str,
        pair: bool,
        _labels: &[String],
        _descriptions: &[String],
    ) -> Result<PromptPieces> {
        if pair {
            return Err(EngineError::InvalidPlan(
                "ai_embed embeds one text, not a pair".into(),
            ));
        }
        Ok(embedding_pieces(template))
    }

    fn column(
        &self,
        _labels: &[String],
        size: u32,
        answers: &[Option<&Answer>],
    ) -> Result<ArrayRef> {
        let size = match size {
            0 => answers
                .iter()
                .find_map(|a| match a {
                    Some(Answer::Vector(v)) => Some(v.len() as u32),
                    _ => None,
                })
                .unwrap_or(0),
            n => n,
        };
        let mut values = Vec::with_capacity(answers.len() * size as usize);
        let mut valid = Vec::with_capacity(answers.len());
        for a in answers {
            match a {
                None => {
                    values.extend(std::iter::repeat_n(0.0f32, size as usize));
                    valid.push(false);
                }
                Some(Answer::Vector(v)) if v.len() == size as usize => {
                    values.extend_from_slice(v);
                    valid.push(true);
                }
                Some(other) => return Err(wrong(self, other)),
            }
        }
        let field = Arc::new(Field::new_list_field(DataType::Float32, true));
        Ok(Arc::new(FixedSizeListArray::try_new(
            field,
            size as i32,
            Arc::new(Float32Array::from(values)),
            Some(NullBuffer::from(valid)),
        )?))
    }

    fn reading(&self) -> ModelReading {
        ModelReading::Embedding
    }

    /// One of the sample's vectors, else the first axis.
    fn drawn(&self, call: &AiCall, sample: SampleSoFar<'_>, u: f64) -> Answer {
        sample.example(u).unwrap_or_else(|| {
            let mut v = vec![0.0f32; call.max_tokens as usize];
            if let Some(first) = v.first_mut() {
                *first = 1.0;
            }
            Answer::Vector(v.into())
        })
    }

    /// A unit vector drawn from the hash (splitmix64 components in [-1, 1)).
    fn hashed(&self, call: &AiCall, h: u64) -> Answer {
        let mut state = h;
        let raw: Vec<f32> = (0..call.max_tokens.max(1))
            .map(|_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                ((z >> 11) as f64 / (1u64 << 52) as f64 - 1.0) as f32
            })
            .collect();
        match embedding_of(&raw, call.max_tokens.max(1)) {
            Ok(v) => Answer::Vector(v),
            Err(e) => Answer::Failed(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Array;

    #[test]
    fn embedding_is_the_normalised_prefix() {
        let v = embedding_of(&[3.0, 4.0, 12.0], 2).unwrap();
        assert_eq!(&*v, &[0.6, 0.8]);
        let v = embedding_of(&[3.0, 4.0, 12.0], 3).unwrap();
        assert!((v[2] - 12.0 / 13.0).abs() < 1e-7, "{v:?}");
        let e = embedding_of(&[3.0, 4.0], 3).unwrap_err();
        assert!(e.contains("3 dimensions") && e.contains("of 2"), "{e}");
        let e = embedding_of(&[0.0, 0.0, 1.0], 2).unwrap_err();
        assert!(e.contains("no direction"), "{e}");
        assert!(embedding_of(&[1.0], 0).is_err());
    }

    #[test]
    fn pieces_prefix_an_instruction_and_end_with_end_of_text() {
        let bare = embedding_pieces("");
        assert_eq!(bare.render("a text", None), "a text<|endoftext|>");
        let query = embedding_pieces("Find reviews");
        assert_eq!(
            query.render("good film", None),
            "Instruct: Find reviews\nQuery:good film<|endoftext|>"
        );
    }

    #[test]
    fn column_is_fixed_size_with_nulls() {
        let a = Answer::Vector(vec![0.6, 0.8].into());
        let col = Embed.column(&[], 2, &[Some(&a), None]).unwrap();
        assert_eq!(col.data_type(), &vector_type(2));
        assert!(col.is_null(1) && col.is_valid(0));
        assert!(Embed.column(&[], 3, &[Some(&a)]).is_err());
        assert!(Embed.fits(&a, &[], 2) && !Embed.fits(&a, &[], 3));
    }
}
