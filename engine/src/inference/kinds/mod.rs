//! What each answer kind is: one [`AnswerKind`] per [`AiKind`] tag, in the
//! style of DataFusion's `ScalarUDFImpl`. A kind says its SQL return type,
//! which answers fit it, its Arrow column (written and read back), its code
//! in the answer cache, its prompt pieces, how the model reads its answer
//! ([`ModelReading`]) and what a simulation answers. The engine asks a kind
//! through [`AiKind::describe`] rather than matching on the tag.
//!
//! Adding a kind: its file here, its tag in [`AiKind`] with its line in
//! [`AiKind::describe`], its SQL spelling in
//! [`crate::exec::ai_functions`]'s registry, and a new [`ModelReading`] (with
//! its arm in the model and simulation executors) only when none of the
//! present ones reads it.

mod classify;
mod classify_scores;
mod complete;
mod embed;
mod extract;
mod filter;
mod join;
mod score;

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use datafusion::arrow::datatypes::DataType;

pub use classify::best_label;
pub use classify_scores::label_probabilities;
pub use complete::answer_type;
pub use embed::{embedding_of, embedding_pieces};
pub use extract::declarations;

use crate::error::{EngineError, Result};
use crate::inference::call::{AiCall, AiKind, Answer};
use crate::inference::prompt::{PromptFormat, PromptPieces};

/// One answer kind: everything the engine knows about a kind of question and
/// its answers. Implementations are unit structs; [`AiKind::describe`] gives
/// the one of a tag.
pub trait AnswerKind: Send + Sync + fmt::Debug {
    /// The name in manifests, label sets and answer files (as the tag
    /// serialises).
    fn name(&self) -> &'static str;

    /// Whether the answer is a label chosen among the call's labels (or a
    /// probability for each).
    fn has_labels(&self) -> bool {
        false
    }

    /// Whether the answer is generated text, which costs decoding and which no
    /// reference label set holds.
    fn generates(&self) -> bool {
        false
    }

    /// Whether the answer is TRUE/FALSE (the kinds an `ai_filter` or `ai_join`
    /// operator can filter rows or pairs by).
    fn is_decision(&self) -> bool {
        false
    }

    /// Whether the call's labels name fields, each asked by its own question
    /// (the call's descriptions) prefilled after the document.
    fn asks_per_field(&self) -> bool {
        false
    }

    /// How many documents every question of the kind is about, when the kind
    /// fixes it (a filter one, a join a pair); `None` when either fits.
    fn documents(&self) -> Option<usize> {
        None
    }

    /// The Arrow type of the answers (an SQL call's value); `fields` are the
    /// call's labels, `size` its `max_tokens` (an embedding's dimensions).
    fn return_type(&self, fields: &[String], size: u32) -> DataType;

    /// Whether the answer depends on the call's `max_tokens`, so that the
    /// answer cache keys it: a generation's bound, an embedding's dimensions.
    fn keys_max_tokens(&self) -> bool {
        self.generates()
    }

    /// Whether an answer of the model (not failed, not unreached) has this
    /// kind's type and fits a call of `labels` labels and `max_tokens`
    /// `size` (an embedding's dimensions).
    fn fits(&self, answer: &Answer, labels: &[String], size: u32) -> bool;

    /// The byte that opens a question's hash in the answer cache: changing
    /// one orphans every cached answer of the kind.
    fn cache_code(&self) -> u8;

    /// The answer column's name in an answer table.
    fn answer_column(&self) -> &'static str;

    /// The plan node's name (EXPLAIN) of a projection asking this kind.
    fn projection_node(&self) -> &'static str {
        "AiPredicate"
    }

    /// The fixed pieces of a call's prompts over one document, or a pair.
    fn pieces(
        &self,
        format: PromptFormat,
        template: &str,
        pair: bool,
        labels: &[String],
        descriptions: &[String],
    ) -> Result<PromptPieces>;

    /// The call's descriptions as they travel: the labels' descriptions, or
    /// rendered questions where the model reads them after the document.
    fn travelling_descriptions(
        &self,
        _format: PromptFormat,
        descriptions: &[String],
    ) -> Vec<String> {
        descriptions.to_vec()
    }

    /// The answers as a column of [`AnswerKind::return_type`] over `labels`
    /// and `size`, NULL where there is none (`size` 0: read from the answers).
    fn column(&self, labels: &[String], size: u32, answers: &[Option<&Answer>])
    -> Result<ArrayRef>;

    /// The answers of an answer table's last column, written by
    /// [`AnswerKind::column`] (or the QUAIL-B harness); a label answer indexes
    /// `labels`, which grows in order of first appearance. The error says
    /// what is wrong; the caller names the table.
    fn read_column(
        &self,
        _column: &TableColumn<'_>,
        _labels: &mut Vec<String>,
    ) -> std::result::Result<Vec<Answer>, String> {
        Err(format!(
            "{} answer tables are written, not read back",
            self.name()
        ))
    }

    /// How the model computes the answer.
    fn reading(&self) -> ModelReading;

    /// The answer a simulation gives a question the estimate's sample did
    /// not ask: drawn from what the sample said, `u` in [0, 1) the question's
    /// own draw.
    fn drawn(&self, call: &AiCall, sample: SampleSoFar<'_>, u: f64) -> Answer;

    /// The content-hash reference's answer to a prompt whose hash is `h`
    /// ([`crate::inference::backend::ContentHashBackend`]).
    fn hashed(&self, call: &AiCall, h: u64) -> Answer;
}

/// How the model computes an answer; the executors have one way of asking
/// for each.
#[derive(Debug, Clone, Copy)]
pub enum ModelReading {
    /// One next-token decision over the TRUE/FALSE head: the answer from the
    /// decision and P(TRUE).
    Decision(fn(bool, f64) -> Answer),
    /// The summed log-probability of every label's continuation.
    Labels(fn(&[f32]) -> Answer),
    /// One text decoded greedily after the prompt.
    Text,
    /// One text per field, each decoded after its question.
    FieldTexts,
    /// The final hidden state of the prompt's last position, made an
    /// embedding of the call's dimensions.
    Embedding,
}

/// What an estimate's sample of one operator said so far: what a drawn
/// answer follows.
#[derive(Debug)]
pub struct SampleSoFar<'a> {
    /// The fraction of TRUE decisions to draw.
    pub selectivity: f64,
    /// The TRUE owed to drawn decisions so far (error diffusion), `None`
    /// before the first.
    pub carry: &'a mut Option<f64>,
    /// How often the sample chose each label.
    pub label_counts: &'a [usize],
    /// The sample's answers, for kinds drawn as one of them.
    pub examples: &'a [Answer],
}

impl SampleSoFar<'_> {
    /// One of the sample's answers picked by `u`, if it has any.
    fn example(&self, u: f64) -> Option<Answer> {
        let n = self.examples.len();
        (n > 0).then(|| self.examples[((u * n as f64) as usize).min(n - 1)].clone())
    }
}

/// One column of an answer table being read back.
#[derive(Debug, Clone, Copy)]
pub struct TableColumn<'a> {
    /// The column's name.
    pub name: &'a str,
    /// Its values.
    pub array: &'a ArrayRef,
}

impl TableColumn<'_> {
    /// An error at the column's first null.
    pub fn no_nulls(&self) -> std::result::Result<(), String> {
        let col = self.array;
        match col
            .nulls()
            .and_then(|nulls| (0..col.len()).find(|&i| nulls.is_null(i)))
        {
            Some(row) => Err(format!("column {} has a null in row {row}", self.name)),
            None => Ok(()),
        }
    }

    /// The column's strings (`what` names it in errors): no nulls.
    pub fn strings(&self, what: &str) -> std::result::Result<Vec<String>, String> {
        self.no_nulls()?;
        let col = self.array.as_string_opt::<i32>().ok_or_else(|| {
            format!(
                "{what} column {} is {}, not a string",
                self.name,
                self.array.data_type()
            )
        })?;
        Ok(col
            .iter()
            .map(|v| v.unwrap_or_default().to_string())
            .collect())
    }
}

impl AiKind {
    /// What this kind is.
    pub fn describe(self) -> &'static dyn AnswerKind {
        match self {
            AiKind::Filter => &filter::Filter,
            AiKind::Join => &join::Join,
            AiKind::Classify => &classify::Classify,
            AiKind::Score => &score::Score,
            AiKind::ClassifyScores => &classify_scores::ClassifyScores,
            AiKind::Complete => &complete::Complete,
            AiKind::Extract => &extract::Extract,
            AiKind::Embed => &embed::Embed,
        }
    }

    /// The name in manifests, label sets and answer files.
    pub fn name(self) -> &'static str {
        self.describe().name()
    }

    /// See [`AnswerKind::has_labels`].
    pub fn has_labels(self) -> bool {
        self.describe().has_labels()
    }

    /// See [`AnswerKind::generates`].
    pub fn generates(self) -> bool {
        self.describe().generates()
    }

    /// See [`AnswerKind::is_decision`].
    pub fn is_decision(self) -> bool {
        self.describe().is_decision()
    }

    /// The Arrow type of the answers (an SQL call's value): label
    /// probabilities are a list of `{label, probability}` in label order, an
    /// extraction a struct of one text per field (named by `fields`).
    pub fn return_type(self, fields: &[String], size: u32) -> DataType {
        self.describe().return_type(fields, size)
    }
}

impl AiCall {
    /// The Arrow type of this call's answers.
    pub fn return_type(&self) -> DataType {
        self.kind.return_type(&self.labels, self.max_tokens)
    }

    /// The labels as EXPLAIN shows them: a long one (a field over a
    /// column's keys) cut after its first 120 characters, saying how many
    /// more it has.
    pub fn shown_labels(&self) -> Vec<String> {
        const SHOWN: usize = 120;
        self.labels
            .iter()
            .map(|l| match l.char_indices().nth(SHOWN) {
                Some((cut, _)) if l.len() > SHOWN + 40 => {
                    format!("{}… ({} more characters)", &l[..cut], l.len() - cut)
                }
                _ => l.clone(),
            })
            .collect()
    }

    /// The most tokens each text of one question decodes: one bound per
    /// field of an extraction (a typed field's grammar may bound it below
    /// `max_tokens`), one for a completion, none for a kind that decodes
    /// nothing.
    pub fn decode_bounds(&self) -> Vec<u32> {
        match self.kind.describe().reading() {
            ModelReading::Text => vec![answer_type(&self.labels).token_bound(self.max_tokens)],
            ModelReading::FieldTexts => declarations(&self.labels)
                .iter()
                .map(|d| d.ty.token_bound(self.max_tokens))
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl Answer {
    /// Whether this answer has the type `call` asks for (and a label index or
    /// probability list that fits its labels): what every backend's and
    /// worker's answers are checked with (an embedding's length is the
    /// call's `max_tokens`). A failed or unreached question fits every kind.
    pub fn fits(&self, call: &AiCall) -> bool {
        !self.is_answer()
            || call
                .kind
                .describe()
                .fits(self, &call.labels, call.max_tokens)
    }
}

/// Pieces of one call's prompts: the one place a question kind chooses its
/// rendering. A score asks its filter's or join's prompt; label probabilities
/// their classification's.
pub fn call_pieces(
    format: PromptFormat,
    kind: AiKind,
    template: &str,
    pair: bool,
    labels: &[String],
    descriptions: &[String],
) -> Result<PromptPieces> {
    kind.describe()
        .pieces(format, template, pair, labels, descriptions)
}

/// The error of an answer column given an answer of another kind.
fn wrong(kind: &dyn AnswerKind, answer: &Answer) -> EngineError {
    EngineError::Inference(format!(
        "a {} answer column was given {}",
        kind.name(),
        answer.describe()
    ))
}

/// A TRUE/FALSE column (filters and joins).
fn decision_column(kind: &dyn AnswerKind, answers: &[Option<&Answer>]) -> Result<ArrayRef> {
    Ok(Arc::new(
        answers
            .iter()
            .map(|a| {
                a.map(|a| a.as_bool().ok_or_else(|| wrong(kind, a)))
                    .transpose()
            })
            .collect::<Result<BooleanArray>>()?,
    ))
}

/// A TRUE/FALSE answer table column read back.
fn read_decisions(column: &TableColumn<'_>) -> std::result::Result<Vec<Answer>, String> {
    column.no_nulls()?;
    let col = column
        .array
        .as_boolean_opt()
        .ok_or_else(|| format!("answer column is {}, not boolean", column.array.data_type()))?;
    Ok(col.values().iter().map(Answer::Bool).collect())
}

/// At most `max_tokens` words (1 to 7) naming `h`: the content-hash
/// reference's text.
fn hash_words(h: u64, max_tokens: u32) -> Box<str> {
    let words = (h % 7 + 1).min(u64::from(max_tokens.max(1)));
    let text: Vec<String> = (0..words)
        .map(|w| format!("w{:x}", (h >> (w * 8)) & 0xff))
        .collect();
    text.join(" ").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer cache's files key every question by its kind's code: a
    /// code that changed or collided would orphan or mix cached answers.
    #[test]
    fn cache_codes_are_the_recorded_ones_and_distinct() {
        let codes: Vec<u8> = AiKind::ALL
            .iter()
            .map(|k| k.describe().cache_code())
            .collect();
        assert_eq!(codes, b"fjcspgxe".to_vec());
    }

    /// Manifests, label sets and answer files spell a kind as its tag
    /// serialises.
    #[test]
    fn names_are_the_serialised_tags() {
        for kind in AiKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
        }
    }
}
