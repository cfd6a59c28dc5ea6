//! Prompt rendering exactly as SPEC §B describes it, produced as pieces.
//!
//! Every prompt is `preamble + document + frame [+ label + partner] + tail`. The
//! document always comes first so its KV can be reused for every question, join
//! partner and label; the pieces are what the model backend prefills and what
//! token accounting (SPEC §D.3) measures, so both use this one renderer.
//!
//! Formats are named and versioned: `raw-v1` (default, the reference layout) and
//! `qwen3-chat-nonthinking-v1` (the Qwen3 chat wrapper with thinking disabled;
//! upstream defined it for filters and joins — classifications here use the same
//! wrapper around the raw-v1 classification text).

use std::fmt;
use std::str::FromStr;

use crate::error::{EngineError, Result};

/// Instruction of filters and joins (raw-v1).
pub const TASK_INSTRUCTION: &str = "Evaluate TRUE or FALSE for the following question: ";
/// Instruction of filters and joins in the chat layout.
pub const CHAT_TASK_INSTRUCTION: &str = "You are performing a data processing task. Evaluate TRUE or FALSE for the following question: ";
/// Instruction of classifications.
pub const CLASSIFY_INSTRUCTION: &str =
    "Answer with exactly one of the categories below for the following question: ";
/// The answer cue that ends every raw-v1 prompt.
pub const ANSWER_CUE: &str = "\nANSWER:";
/// What the chat layout appends after the answer cue.
pub const CHAT_SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
/// Shared preamble (raw-v1).
pub const PREAMBLE: &str = "DOCUMENT:\n";
/// Shared preamble in the chat layout.
pub const CHAT_PREAMBLE: &str = "<|im_start|>user\nDOCUMENT:\n";
/// Scored continuation prefix of a label.
pub const LABEL_PREFIX: &str = " ";

/// A named, versioned prompt layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PromptFormat {
    /// Plain text, no chat template (the reference layout).
    #[default]
    RawV1,
    /// Qwen3 chat template with an empty think block.
    Qwen3ChatNonthinkingV1,
}

impl PromptFormat {
    /// The format's name as written in results.
    pub fn name(self) -> &'static str {
        match self {
            PromptFormat::RawV1 => "raw-v1",
            PromptFormat::Qwen3ChatNonthinkingV1 => "qwen3-chat-nonthinking-v1",
        }
    }

    /// Text before the first document.
    pub(crate) fn preamble(self) -> &'static str {
        match self {
            PromptFormat::RawV1 => PREAMBLE,
            PromptFormat::Qwen3ChatNonthinkingV1 => CHAT_PREAMBLE,
        }
    }

    fn task_instruction(self) -> &'static str {
        match self {
            PromptFormat::RawV1 => TASK_INSTRUCTION,
            PromptFormat::Qwen3ChatNonthinkingV1 => CHAT_TASK_INSTRUCTION,
        }
    }

    /// The text every prompt ends with.
    pub(crate) fn cue(self) -> String {
        match self {
            PromptFormat::RawV1 => ANSWER_CUE.to_string(),
            PromptFormat::Qwen3ChatNonthinkingV1 => format!("{ANSWER_CUE}{CHAT_SUFFIX}"),
        }
    }
}

impl fmt::Display for PromptFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PromptFormat {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "raw-v1" => Ok(PromptFormat::RawV1),
            "qwen3-chat-nonthinking-v1" => Ok(PromptFormat::Qwen3ChatNonthinkingV1),
            other => Err(EngineError::InvalidPlan(format!(
                "unknown prompt format {other:?} (known: raw-v1, qwen3-chat-nonthinking-v1)"
            ))),
        }
    }
}

/// The fixed text around the documents of one operator's prompts.
///
/// A one-document prompt is `preamble + document + tail` (`frame` and `label`
/// empty); a two-document prompt is
/// `preamble + anchor + frame + label + partner + tail`.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct PromptPieces {
    /// Text before the first document.
    pub preamble: String,
    /// Text after the anchor document (two-document prompts).
    pub frame: String,
    /// Text before the partner document (two-document prompts).
    pub label: String,
    /// Text after the last document, ending with the answer cue.
    pub tail: String,
    /// Whether the prompt has a partner document.
    pub pair: bool,
}

impl PromptPieces {
    /// Bytes of fixed text in one prompt (all pieces, documents aside).
    pub fn fixed_len(&self) -> usize {
        self.preamble.len() + self.frame.len() + self.label.len() + self.tail.len()
    }

    /// The whole prompt for one document or a pair.
    pub fn render(&self, document: &str, partner: Option<&str>) -> String {
        let mut s = String::with_capacity(
            self.preamble.len() + document.len() + self.frame.len() + self.tail.len() + 64,
        );
        s.push_str(&self.preamble);
        s.push_str(document);
        s.push_str(&self.frame);
        if let Some(p) = partner {
            s.push_str(&self.label);
            s.push_str(p);
        }
        s.push_str(&self.tail);
        s
    }
}

/// Splits a one-placeholder template into (separator S, question C) per SPEC §B.2.
fn question_after_document(template: &str) -> Result<(String, String)> {
    let brace = template.find('{').ok_or_else(|| {
        EngineError::InvalidPlan(format!("template has no {{0}}: {}", shorten(template, 60)))
    })?;
    if !template[brace..].starts_with("{0}") {
        return Err(EngineError::InvalidPlan(format!(
            "template has a brace before its {{0}} placeholder: {}",
            shorten(template, 60)
        )));
    }
    let pre = &template[..brace];
    let rest = &template[brace + 3..];
    let frame = pre.trim();
    let q = if frame.is_empty() {
        rest.to_string()
    } else {
        format!("\n\n{frame}{rest}")
    };
    let c = q.trim_start_matches('\n');
    let s = &q[..q.len() - c.len()];
    let s = if s.is_empty() { "\n\n" } else { s };
    Ok((s.to_string(), c.to_string()))
}

/// The categories block: header and one line per label.
fn categories(labels: &[String], descriptions: &[String]) -> String {
    let mut s = String::from("\n\nCategories:");
    for (i, l) in labels.iter().enumerate() {
        s.push_str("\n- ");
        s.push_str(l);
        if let Some(d) = descriptions.get(i).filter(|d| !d.is_empty()) {
            s.push_str(": ");
            s.push_str(d);
        }
    }
    s
}

/// Pieces of a filter prompt (SPEC §B.2).
pub fn filter_pieces(format: PromptFormat, template: &str) -> Result<PromptPieces> {
    let (s, c) = question_after_document(template)?;
    Ok(PromptPieces {
        preamble: format.preamble().to_string(),
        frame: String::new(),
        label: String::new(),
        tail: format!("{s}{}{c}{}", format.task_instruction(), format.cue()),
        pair: false,
    })
}

/// Pieces of a join prompt with anchor `{0}` (SPEC §B.3).
pub fn join_pieces(format: PromptFormat, template: &str) -> PromptPieces {
    PromptPieces {
        preamble: format.preamble().to_string(),
        frame: format!(
            "\n\n(The document above is DOCUMENT {{0}}.)\n\n{}{template}",
            format.task_instruction()
        ),
        label: "\n\nDOCUMENT {1}:\n".to_string(),
        tail: format.cue(),
        pair: true,
    }
}

/// Pieces of a one-document classification prompt (SPEC §B.4).
pub fn classify_pieces(
    format: PromptFormat,
    template: &str,
    labels: &[String],
    descriptions: &[String],
) -> Result<PromptPieces> {
    let (s, c) = question_after_document(template)?;
    Ok(PromptPieces {
        preamble: format.preamble().to_string(),
        frame: String::new(),
        label: String::new(),
        tail: format!(
            "{s}{CLASSIFY_INSTRUCTION}{c}{}{}",
            categories(labels, descriptions),
            format.cue()
        ),
        pair: false,
    })
}

/// Pieces of a joined-row classification prompt (SPEC §B.4, two documents).
pub fn pair_classify_pieces(
    format: PromptFormat,
    template: &str,
    labels: &[String],
    descriptions: &[String],
) -> PromptPieces {
    PromptPieces {
        preamble: format.preamble().to_string(),
        frame: "\n\n(The document above is DOCUMENT {0}.)".to_string(),
        label: "\n\nDOCUMENT {1}:\n".to_string(),
        tail: format!(
            "\n\n{CLASSIFY_INSTRUCTION}{template}{}{}",
            categories(labels, descriptions),
            format.cue()
        ),
        pair: true,
    }
}

/// What follows the document in every prompt of an extraction; each field's
/// question and the answer cue come after it ([`extract_questions`]).
pub const EXTRACT_SEPARATOR: &str = "\n\n";

/// The text after [`EXTRACT_SEPARATOR`] for each of an extraction's
/// questions: the question, then the answer cue. A field's prompt is
/// `preamble + document + separator + this`, so every field of a document
/// reuses the document's KV.
pub fn extract_questions(format: PromptFormat, questions: &[String]) -> Vec<String> {
    questions
        .iter()
        .map(|q| format!("{q}{}", format.cue()))
        .collect()
}

/// Pieces of a generating prompt: as a filter's, without the TRUE/FALSE
/// instruction (the question is the user's whole instruction).
pub fn complete_pieces(format: PromptFormat, template: &str) -> Result<PromptPieces> {
    let (s, c) = question_after_document(template)?;
    Ok(PromptPieces {
        preamble: format.preamble().to_string(),
        frame: String::new(),
        label: String::new(),
        tail: format!("{s}{c}{}", format.cue()),
        pair: false,
    })
}

/// Pieces of a generating prompt over a pair: as a joined-row
/// classification's, without the instruction and categories.
pub fn pair_complete_pieces(format: PromptFormat, template: &str) -> PromptPieces {
    PromptPieces {
        preamble: format.preamble().to_string(),
        frame: "\n\n(The document above is DOCUMENT {0}.)".to_string(),
        label: "\n\nDOCUMENT {1}:\n".to_string(),
        tail: format!("\n\n{template}{}", format.cue()),
        pair: true,
    }
}

/// Checks a template has exactly the placeholders `{0}..{n-1}` (SPEC §B.2):
/// each present, none beyond.
pub fn check_placeholders(template: &str, n: usize) -> std::result::Result<(), String> {
    for i in 0..n {
        if !template.contains(&format!("{{{i}}}")) {
            return Err(format!(
                "the template has no {{{i}}} placeholder but {n} document(s)"
            ));
        }
    }
    if template.contains(&format!("{{{n}}}")) {
        return Err(format!(
            "the template has more placeholders than its {n} document(s)"
        ));
    }
    Ok(())
}

/// The continuations scored for a classification: `" " + label`.
pub fn label_continuations(labels: &[String]) -> Vec<String> {
    labels
        .iter()
        .map(|l| format!("{LABEL_PREFIX}{l}"))
        .collect()
}

/// Characters of a text an error quotes ([`Excerpt`]).
pub const EXCERPT_CHARS: usize = 200;

/// A text quoted in an error message: whole when it is at most
/// [`EXCERPT_CHARS`] characters, else those first characters and its size
/// (`… (20971520 bytes)`), newlines shown as `⏎`. A document can stand as a
/// row's id (a table without an id column) and be megabytes long; an error
/// names it, never prints it. Cut only when displayed.
#[derive(Debug, Clone, Copy)]
pub struct Excerpt<'a>(pub &'a str);

impl fmt::Display for Excerpt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        let cut = text.char_indices().nth(EXCERPT_CHARS).map(|(at, _)| at);
        let head = &text[..cut.unwrap_or(text.len())];
        for (i, line) in head.split('\n').enumerate() {
            if i > 0 {
                f.write_str("⏎")?;
            }
            f.write_str(line)?;
        }
        if cut.is_some() {
            write!(f, "… ({} bytes)", text.len())?;
        }
        Ok(())
    }
}

/// `text` cut to about `max` characters with an ellipsis, newlines shown as `⏎`.
pub fn shorten(text: &str, max: usize) -> String {
    let flat = text.replace('\n', "⏎");
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_keeps_a_short_text_and_cuts_a_long_one_with_its_size() {
        assert_eq!(Excerpt("r-1\nx").to_string(), "r-1⏎x");
        let exact = "é".repeat(EXCERPT_CHARS);
        assert_eq!(Excerpt(&exact).to_string(), exact);
        let long = format!("{}{}", "é".repeat(EXCERPT_CHARS), "x".repeat(20 << 20));
        let shown = Excerpt(&long).to_string();
        assert_eq!(
            shown,
            format!("{}… ({} bytes)", "é".repeat(EXCERPT_CHARS), long.len())
        );
    }

    const F1: &str = "Judge strictly from the review above whether it mentions at least one positive aspect of the movie.\n\n{0}\n\nInstruction: answer TRUE if the review mentions at least one positive aspect of the movie, FALSE otherwise.";

    #[test]
    fn filter_prompt_matches_spec_example() {
        let p = filter_pieces(PromptFormat::RawV1, F1).unwrap();
        assert_eq!(
            p.render("<R>", None),
            "DOCUMENT:\n<R>\n\nEvaluate TRUE or FALSE for the following question: Judge strictly from the review above whether it mentions at least one positive aspect of the movie.\n\nInstruction: answer TRUE if the review mentions at least one positive aspect of the movie, FALSE otherwise.\nANSWER:"
        );
        let n = filter_pieces(
            PromptFormat::RawV1,
            "Is this reaction neurological, affecting the nervous system? {0}",
        )
        .unwrap();
        assert_eq!(
            n.render("<T>", None),
            "DOCUMENT:\n<T>\n\nEvaluate TRUE or FALSE for the following question: Is this reaction neurological, affecting the nervous system?\nANSWER:"
        );
    }

    #[test]
    fn join_prompt_matches_spec_example() {
        let p = join_pieces(
            PromptFormat::RawV1,
            "Does the review in DOCUMENT {0} discuss the movie aspect in DOCUMENT {1}?",
        );
        assert_eq!(
            p.render("<R>", Some("<A>")),
            "DOCUMENT:\n<R>\n\n(The document above is DOCUMENT {0}.)\n\nEvaluate TRUE or FALSE for the following question: Does the review in DOCUMENT {0} discuss the movie aspect in DOCUMENT {1}?\n\nDOCUMENT {1}:\n<A>\nANSWER:"
        );
    }

    #[test]
    fn classify_prompts_match_spec_examples() {
        let labels: Vec<String> = ["positive", "negative", "neutral", "mixed"]
            .map(String::from)
            .to_vec();
        let empty = vec![String::new(); 4];
        let p = classify_pieces(
            PromptFormat::RawV1,
            "Judge strictly from the review above which category best describes the overall sentiment it expresses about the movie.\n\n{0}",
            &labels,
            &empty,
        )
        .unwrap();
        assert_eq!(
            p.render("<R>", None),
            "DOCUMENT:\n<R>\n\nAnswer with exactly one of the categories below for the following question: Judge strictly from the review above which category best describes the overall sentiment it expresses about the movie.\n\nCategories:\n- positive\n- negative\n- neutral\n- mixed\nANSWER:"
        );
        let tr: Vec<String> = ["bug fixed, tests pass", "bug still occurs"]
            .map(String::from)
            .to_vec();
        let d: Vec<String> = [
            "the reported bug no longer occurs and other tests pass",
            "the reported bug still happens",
        ]
        .map(String::from)
        .to_vec();
        let p = classify_pieces(
            PromptFormat::RawV1,
            "Judge strictly from the agent trace above what the most recent test or reproduction run showed.\n\n{0}",
            &tr,
            &d,
        )
        .unwrap();
        assert!(p.tail.ends_with("\n- bug fixed, tests pass: the reported bug no longer occurs and other tests pass\n- bug still occurs: the reported bug still happens\nANSWER:"));
        let pair = pair_classify_pieces(
            PromptFormat::RawV1,
            "Judge strictly from the review in DOCUMENT {0} what sentiment it expresses about the movie aspect in DOCUMENT {1}.",
            &labels,
            &empty,
        );
        assert_eq!(
            pair.render("<R>", Some("<A>")),
            "DOCUMENT:\n<R>\n\n(The document above is DOCUMENT {0}.)\n\nDOCUMENT {1}:\n<A>\n\nAnswer with exactly one of the categories below for the following question: Judge strictly from the review in DOCUMENT {0} what sentiment it expresses about the movie aspect in DOCUMENT {1}.\n\nCategories:\n- positive\n- negative\n- neutral\n- mixed\nANSWER:"
        );
    }

    #[test]
    fn chat_format_wraps_the_prompt() {
        let p = filter_pieces(PromptFormat::Qwen3ChatNonthinkingV1, F1).unwrap();
        let s = p.render("<R>", None);
        assert!(s.starts_with("<|im_start|>user\nDOCUMENT:\n<R>\n\nYou are performing a data processing task. Evaluate TRUE"));
        assert!(s.ends_with("\nANSWER:<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert_eq!(
            "qwen3-chat-nonthinking-v1".parse::<PromptFormat>().unwrap(),
            PromptFormat::Qwen3ChatNonthinkingV1
        );
        assert!("chatml".parse::<PromptFormat>().is_err());
    }

    #[test]
    fn brace_before_placeholder_is_an_error() {
        assert!(filter_pieces(PromptFormat::RawV1, "a {x} b {0}").is_err());
    }
}
