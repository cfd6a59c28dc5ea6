//! The call vocabulary: what an AI operator asks ([`AiCall`], its kind
//! [`AiKind`]), of which documents ([`AiRequest`], [`Doc`]), and what it gets
//! back ([`Answer`]). Every backend, cache, worker and operator speaks it; it
//! depends on nothing of the inference folder but the prompt pieces a call
//! carries.

use datafusion::arrow::datatypes::{DataType, Field, Fields};

use crate::inference::prompt::PromptPieces;

/// What kind of question an operator asks (`"filter"`, `"join"`,
/// `"classify"`, … in manifests and label sets): a tag, whose
/// [`AiKind::describe`] says what the kind is (its answer's type, how the
/// model reads it, …). The SQL functions that ask each kind are in
/// [`crate::exec::ai_functions`]'s registry.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum AiKind {
    /// TRUE/FALSE about one document: one next-token decision (SPEC §B.5).
    Filter,
    /// TRUE/FALSE about a pair.
    Join,
    /// One label for a document or a pair: the best summed label log-probability.
    Classify,
    /// P(TRUE) over the restricted TRUE/FALSE head, for a document or a pair.
    Score,
    /// One probability per label: the softmax of the labels' summed
    /// log-probabilities, from the pass that [`AiKind::Classify`] reads.
    ClassifyScores,
    /// Text: greedy decoding until the end of sequence or `max_tokens`.
    Complete,
    /// Several texts about one document, one per field (the call's labels
    /// name the fields, its descriptions hold their questions), each decoded
    /// after the document's shared KV.
    Extract,
    /// A text's embedding: the final hidden state of its prompt's last
    /// position, L2-normalised (Qwen3-Embedding's pooling); `max_tokens`
    /// carries the dimensions kept.
    Embed,
}

impl AiKind {
    /// Every kind.
    pub const ALL: [AiKind; 8] = [
        AiKind::Filter,
        AiKind::Join,
        AiKind::Classify,
        AiKind::Score,
        AiKind::ClassifyScores,
        AiKind::Complete,
        AiKind::Extract,
        AiKind::Embed,
    ];
}

/// The fields of one label probability: `label` and `probability`.
pub fn label_score_fields() -> Fields {
    Fields::from(vec![
        Field::new("label", DataType::Utf8, false),
        Field::new("probability", DataType::Float64, false),
    ])
}

impl AiCall {
    /// Whether `other` asks the same question of a document as this call: the
    /// same kind, pieces and what the answer depends on besides them (labels
    /// or fields, their descriptions or questions, `max_tokens`); operators
    /// and tables aside.
    pub fn asks_as(&self, other: &AiCall) -> bool {
        self.kind == other.kind
            && self.pieces == other.pieces
            && self.labels == other.labels
            && self.descriptions == other.descriptions
            && self.max_tokens == other.max_tokens
    }
}

/// One answer to one prompt, typed by the kind of question ([`AiKind`]).
/// Large variants are boxed so that the query's memo keeps 24 bytes a question.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Answer {
    /// A filter's or join's TRUE/FALSE.
    Bool(bool),
    /// A classification: the index of the chosen label in the call's labels.
    Label(u32),
    /// A score: P(TRUE) in [0, 1].
    Score(f64),
    /// One probability per label, in the call's label order, summing to 1.
    LabelScores(Box<[f64]>),
    /// Generated text.
    Text(Box<str>),
    /// One generated text per field of an extraction, in field order.
    Fields(Box<[Box<str>]>),
    /// An embedding: unit length, as many components as the call's
    /// dimensions.
    Vector(Box<[f32]>),
    /// No answer: the model cannot answer this row (its prompt is longer than
    /// the model's context, its generated tokens are not text). The reason
    /// names the operator and the row. Never cached; what the operator does
    /// with it is `--on-row-error`'s ([`crate::exec::coverage`]).
    Failed(Box<str>),
    /// Not asked: the query's budget was spent first ([`crate::limits::spend`]).
    /// Never cached; the operator fails or leaves the row out
    /// ([`crate::exec::coverage`]).
    Unreached,
}

impl Answer {
    /// Whether this is an answer of the model (not [`Answer::Failed`] or
    /// [`Answer::Unreached`]): what may be cached, recorded and shown.
    pub fn is_answer(&self) -> bool {
        !matches!(self, Answer::Failed(_) | Answer::Unreached)
    }

    /// The TRUE/FALSE of a decision, `None` for other answers.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Answer::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// A short description for errors (never a whole generated text).
    pub fn describe(&self) -> String {
        match self {
            Answer::Bool(b) => format!("TRUE/FALSE {b}"),
            Answer::Label(i) => format!("label index {i}"),
            Answer::Score(p) => format!("score {p}"),
            Answer::LabelScores(p) => format!("{} label probabilities", p.len()),
            Answer::Text(t) => format!("a text of {} bytes", t.len()),
            Answer::Fields(f) => format!("{} field texts", f.len()),
            Answer::Vector(v) => format!("a vector of {} components", v.len()),
            Answer::Failed(_) => "a failed row".into(),
            Answer::Unreached => "no answer (the budget was spent)".into(),
        }
    }
}

/// One AI operator as the backend sees it (and as it is sent to a worker).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct AiCall {
    /// Operator id (`filter-1`, `join-2`, `classify-1`).
    pub op_id: String,
    /// Question kind.
    pub kind: AiKind,
    /// Prompt template as written in the plan.
    pub template: String,
    /// Tables of the `{0}` (and `{1}`) documents.
    pub tables: Vec<String>,
    /// Text columns of the `{0}` (and `{1}`) documents.
    pub columns: Vec<String>,
    /// Rendered fixed pieces of the operator's prompts.
    pub pieces: PromptPieces,
    /// Classification labels (tie-break order).
    pub labels: Vec<String>,
    /// Most tokens a generating call ([`AiKind::Complete`], each field of an
    /// [`AiKind::Extract`]) decodes; the dimensions an [`AiKind::Embed`]
    /// keeps; 0 for other kinds.
    pub max_tokens: u32,
    /// One description per label ("" = none).
    pub descriptions: Vec<String>,
    /// Relations (aliases, as the plan names them) of the `{0}` (and `{1}`)
    /// documents; empty when not known. One table read under two names is read
    /// twice, which a scheduler may plan around.
    pub relations: Vec<String>,
}

/// A document in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doc<'a> {
    /// Row id.
    pub id: &'a str,
    /// Text the prompt embeds.
    pub text: &'a str,
}

/// One prompt to answer: the anchor (`{0}`) document and, for two-document
/// operators, the partner (`{1}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AiRequest<'a> {
    /// The `{0}` document.
    pub anchor: Doc<'a>,
    /// The `{1}` document.
    pub partner: Option<Doc<'a>>,
}
