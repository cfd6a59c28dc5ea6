//! `ai_agg(instruction, column)`: an AI answer over many rows, beyond one
//! context window (Snowflake `AI_AGG`, `AI_SUMMARIZE_AGG`).
//!
//! A group's texts are packed in order into chunks that fit one prompt, each
//! chunk is answered with the instruction by greedy decoding, and the partial
//! answers are packed and combined the same way until one remains
//! ([`reduce_groups`]). Chunks are measured in bytes, an upper bound of their
//! tokens (a byte-level BPE token covers at least one byte), so a prompt never
//! overflows the model's context and every path packs the same chunks.
//!
//! The planner rule ([`crate::sql::rewrite`]) turns `ai_agg(i, c)` into
//! `array_agg(c)` below an AI operator that reduces each group's list, batching
//! the prompts of all groups of a batch; [`AiAggUdf`] is the row-by-row
//! reference the differential tests compare it with, and an error where the rule
//! did not rewrite it.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, ListArray, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Expr, Signature, Volatility};

use crate::error::{EngineError, Result};
use crate::inference::backend::{
    AiCall, AiKind, AiRequest, Answer, Doc, ask_once, check_answers, require_answered,
};
use crate::inference::prompt::{PromptFormat, PromptPieces, shorten};

/// Separates the rows (or partial answers) packed into one prompt.
pub const ROW_SEPARATOR: &str = "\n\n";

/// The instruction of `AI_SUMMARIZE_AGG(column)`.
pub const SUMMARIZE_INSTRUCTION: &str = "Summarise the rows above in a few sentences, keeping what they have in common and what stands out.";

/// Context assumed for a backend that states none (a remote worker, a test
/// backend): small enough for any Qwen3.
pub const DEFAULT_CONTEXT_POSITIONS: usize = 4096;

/// The prompt pieces of one round: the rows (or partial answers) are the
/// document, the instruction (or the combining instruction) its question.
pub fn round_pieces(format: PromptFormat, instruction: &str, combine: bool) -> PromptPieces {
    let question = if combine {
        format!(
            "The text above holds partial answers, each over some of the rows. Combine them into \
             one answer to: {instruction}"
        )
    } else {
        instruction.to_string()
    };
    PromptPieces {
        preamble: format.preamble().to_string(),
        frame: String::new(),
        label: String::new(),
        tail: format!("{ROW_SEPARATOR}{question}{}", format.cue()),
        pair: false,
    }
}

/// The calls of a reduction: the first round's (the instruction over rows)
/// and the later rounds' (combining partial answers).
#[derive(Debug, Clone)]
pub struct AggCalls {
    /// Over the rows.
    pub first: AiCall,
    /// Over partial answers.
    pub combine: AiCall,
}

impl AggCalls {
    /// The calls of operator `op_id` for `instruction` over `table.column`.
    pub fn new(
        op_id: &str,
        format: PromptFormat,
        instruction: &str,
        max_tokens: u32,
        table: &str,
        column: &str,
    ) -> Self {
        let call = |combine: bool| AiCall {
            op_id: op_id.to_string(),
            kind: AiKind::Complete,
            template: instruction.to_string(),
            tables: vec![format!("{table} (ai_agg)")],
            columns: vec![column.to_string()],
            pieces: round_pieces(format, instruction, combine),
            labels: Vec::new(),
            max_tokens,
            descriptions: Vec::new(),
            relations: Vec::new(),
        };
        Self {
            first: call(false),
            combine: call(true),
        }
    }
}

/// Packs `texts` in order into chunks of at most `capacity` bytes (rows joined
/// by [`ROW_SEPARATOR`]). A text longer than `capacity` alone is an error
/// (its group fails).
fn pack(texts: &[String], capacity: usize, what: &str) -> Result<Vec<String>> {
    let mut chunks: Vec<String> = Vec::new();
    let mut current = String::new();
    for t in texts {
        if t.len() > capacity {
            return Err(EngineError::Inference(format!(
                "ai_agg: {what} of {} bytes ({}) does not fit one prompt of the model's context \
                 ({capacity} bytes of text with the instruction and max_tokens)",
                t.len(),
                shorten(t, 60)
            )));
        }
        let joined = current.len() + ROW_SEPARATOR.len() + t.len();
        if !current.is_empty() && joined > capacity {
            chunks.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push_str(ROW_SEPARATOR);
        }
        current.push_str(t);
    }
    if !current.is_empty() || chunks.is_empty() {
        chunks.push(current);
    }
    Ok(chunks)
}

/// One answer per group: `ask` answers a round's requests of `call` (all
/// groups' chunks at once, documents named by their text). A group without
/// texts answers `None` (NULL); a group with a text no prompt can hold, or
/// whose chunk the model could not answer, is [`Answer::Failed`], and one the
/// model did not reach (a spent budget) [`Answer::Unreached`]. Otherwise the answer is [`Answer::Text`]. `context` is
/// the model's context in positions.
pub fn reduce_groups(
    calls: &AggCalls,
    context: usize,
    groups: &[Vec<String>],
    mut ask: impl FnMut(&AiCall, &[AiRequest<'_>]) -> Result<Vec<Answer>>,
) -> Result<Vec<Option<Answer>>> {
    let mut out: Vec<Option<Answer>> = vec![None; groups.len()];
    let mut pending: Vec<(usize, Vec<String>)> = groups
        .iter()
        .enumerate()
        .filter(|(_, g)| !g.is_empty())
        .map(|(i, g)| (i, g.clone()))
        .collect();
    let mut round = 0;
    while !pending.is_empty() {
        let call = if round == 0 {
            &calls.first
        } else {
            &calls.combine
        };
        let fixed = call.pieces.fixed_len() + call.max_tokens as usize;
        let capacity = context
            .checked_sub(fixed)
            .filter(|&c| c > 0)
            .ok_or_else(|| {
                EngineError::Inference(format!(
                    "{}: the instruction and max_tokens ({fixed} positions at most) leave no room \
                 for rows in the model's context of {context}",
                    call.op_id
                ))
            })?;
        let what = if round == 0 {
            "a row"
        } else {
            "a partial answer"
        };
        // A group with a text that fits no prompt, or partial answers no two
        // of which fit one, cannot be answered: it fails alone.
        let mut chunked: Vec<Vec<String>> = Vec::with_capacity(pending.len());
        let mut packed = Vec::with_capacity(pending.len());
        for (g, texts) in std::mem::take(&mut pending) {
            let chunks = pack(&texts, capacity, what).and_then(|chunks| {
                if round > 0 && texts.len() > 1 && chunks.len() == texts.len() {
                    return Err(EngineError::Inference(format!(
                        "{}: the {} partial answers of group {g} are too long to combine two \
                         in one prompt; a smaller max_tokens leaves room",
                        call.op_id,
                        texts.len()
                    )));
                }
                Ok(chunks)
            });
            match chunks {
                Ok(chunks) => {
                    chunked.push(chunks);
                    packed.push((g, texts));
                }
                Err(EngineError::Inference(why)) => out[g] = Some(Answer::Failed(why.into())),
                Err(e) => return Err(e),
            }
        }
        pending = packed;
        let requests: Vec<AiRequest<'_>> = chunked
            .iter()
            .flatten()
            .map(|text| AiRequest {
                anchor: Doc { id: text, text },
                partner: None,
            })
            .collect();
        let answers = ask(call, &requests)?;
        check_answers(call, "the backend", &answers, requests.len())?;
        let mut answers = answers.into_iter();
        let mut next = Vec::new();
        for ((g, _), chunks) in pending.iter().zip(&chunked) {
            let mine: Vec<Answer> = answers.by_ref().take(chunks.len()).collect();
            if let Some(stop) = mine.iter().find(|a| !a.is_answer()) {
                out[*g] = Some(stop.clone());
                continue;
            }
            let texts: Vec<String> = mine
                .into_iter()
                .map(|a| match a {
                    Answer::Text(t) => t.to_string(),
                    other => unreachable!("checked as text: {other:?}"),
                })
                .collect();
            if chunks.len() == 1 {
                out[*g] = texts.into_iter().next().map(|t| Answer::Text(t.into()));
            } else {
                next.push((*g, texts));
            }
        }
        pending = next;
        round += 1;
    }
    Ok(out)
}

/// Whether `e` calls `ai_agg`, with its arguments.
pub fn ai_agg_of(e: &Expr) -> Option<&AggregateFunction> {
    match e {
        Expr::AggregateFunction(f) if f.func.inner().downcast_ref::<AiAggUdf>().is_some() => {
            Some(f)
        }
        _ => None,
    }
}

/// `ai_agg` as a DataFusion aggregate function.
#[derive(Debug)]
pub struct AiAggUdf {
    signature: Signature,
    naive: Option<crate::exec::ai_functions::NaiveEvaluator>,
}

impl PartialEq for AiAggUdf {
    fn eq(&self, other: &Self) -> bool {
        match (&self.naive, &other.naive) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(&a.backend, &b.backend),
            _ => false,
        }
    }
}

impl Eq for AiAggUdf {}

impl std::hash::Hash for AiAggUdf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        "ai_agg".hash(state);
        self.naive.is_some().hash(state);
    }
}

impl AiAggUdf {
    /// The aggregate, evaluated one group at a time by `naive` if given.
    pub fn new(naive: Option<crate::exec::ai_functions::NaiveEvaluator>) -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Immutable),
            naive,
        }
    }
}

impl AggregateUDFImpl for AiAggUdf {
    fn name(&self) -> &str {
        "ai_agg"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        Ok(vec![
            Arc::new(Field::new(
                format!("{}[instruction]", args.name),
                DataType::Utf8,
                true,
            )),
            Arc::new(Field::new(
                format!("{}[rows]", args.name),
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            )),
            Arc::new(Field::new(
                format!("{}[max_tokens]", args.name),
                DataType::UInt32,
                true,
            )),
        ])
    }

    fn accumulator(&self, _args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        let Some(naive) = &self.naive else {
            return Err(DataFusionError::Plan(
                "ai_agg was left as a row-by-row aggregate: AI aggregates are planned as AI \
                 operators, and this one was in a place the planner does not rewrite (a window, \
                 a join condition)"
                    .into(),
            ));
        };
        Ok(Box::new(AiAggAccumulator {
            naive: naive.clone(),
            instruction: None,
            max_tokens: None,
            rows: Vec::new(),
        }))
    }
}

/// One group's rows, answered when the group is evaluated.
#[derive(Debug)]
struct AiAggAccumulator {
    naive: crate::exec::ai_functions::NaiveEvaluator,
    instruction: Option<String>,
    max_tokens: Option<u32>,
    rows: Vec<String>,
}

impl AiAggAccumulator {
    fn take_max_tokens(&mut self, array: Option<&ArrayRef>) -> DfResult<()> {
        let Some(array) = array else {
            return Ok(());
        };
        let numbers = cast(array, &DataType::UInt32)?;
        let numbers = numbers.as_primitive::<datafusion::arrow::datatypes::UInt32Type>();
        if let Some(i) = (0..numbers.len()).find(|&i| numbers.is_valid(i)) {
            self.max_tokens.get_or_insert(numbers.value(i));
        }
        Ok(())
    }

    fn take_instruction(&mut self, array: &ArrayRef) -> DfResult<()> {
        let strings = cast(array, &DataType::Utf8)?;
        let strings = strings.as_string::<i32>();
        if let Some(i) = (0..strings.len()).find(|&i| strings.is_valid(i)) {
            self.instruction
                .get_or_insert_with(|| strings.value(i).to_string());
        }
        Ok(())
    }

    fn take_rows(&mut self, array: &StringArray) {
        self.rows.extend(array.iter().flatten().map(str::to_string));
    }
}

impl Accumulator for AiAggAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        self.take_instruction(&values[0])?;
        self.take_max_tokens(values.get(2))?;
        let rows = cast(&values[1], &DataType::Utf8)?;
        self.take_rows(rows.as_string::<i32>());
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        self.take_instruction(&states[0])?;
        self.take_max_tokens(states.get(2))?;
        let lists: &ListArray = states[1].as_list::<i32>();
        for i in 0..lists.len() {
            if lists.is_valid(i) {
                let rows = cast(&lists.value(i), &DataType::Utf8)?;
                self.take_rows(rows.as_string::<i32>());
            }
        }
        Ok(())
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        let rows: Vec<ScalarValue> = self
            .rows
            .iter()
            .map(|r| ScalarValue::Utf8(Some(r.clone())))
            .collect();
        Ok(vec![
            ScalarValue::Utf8(self.instruction.clone()),
            ScalarValue::List(ScalarValue::new_list_nullable(&rows, &DataType::Utf8)),
            ScalarValue::UInt32(self.max_tokens),
        ])
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        let instruction = self.instruction.clone().unwrap_or_default();
        let backend = self.naive.backend.clone();
        let calls = AggCalls::new(
            "naive",
            self.naive.format,
            &instruction,
            self.max_tokens
                .unwrap_or(crate::exec::ai_functions::DEFAULT_MAX_TOKENS),
            "",
            "",
        );
        let context = backend
            .context_positions()
            .unwrap_or(DEFAULT_CONTEXT_POSITIONS);
        let groups = vec![std::mem::take(&mut self.rows)];
        let answer = reduce_groups(&calls, context, &groups, |call, requests| {
            ask_once(&backend, call, requests)
        })
        .and_then(|out| require_answered(out.into_iter().flatten().collect()))
        .map_err(DataFusionError::from)?;
        Ok(ScalarValue::Utf8(answer.into_iter().next().map(
            |a| match a {
                Answer::Text(t) => t.to_string(),
                other => unreachable!("reduced to text: {other:?}"),
            },
        )))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.rows.iter().map(|r| r.capacity() + 24).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::backend::{Answerer, ContentHashBackend};

    #[test]
    fn rows_are_packed_in_order_and_reduced_until_one_answer_remains() {
        let backend = ContentHashBackend::default();
        let calls = AggCalls::new("agg-1", PromptFormat::default(), "Summarise.", 4, "t", "c");
        let rows: Vec<String> = (0..40)
            .map(|i| format!("row {i} {}", "x".repeat(i)))
            .collect();
        let groups = vec![rows.clone(), Vec::new(), rows[..2].to_vec()];
        let mut rounds = Vec::new();
        let out = reduce_groups(&calls, 300, &groups, |call, requests| {
            rounds.push(requests.len());
            for r in requests {
                let prompt = call.pieces.render(r.anchor.text, None);
                assert!(prompt.len() + call.max_tokens as usize <= 300, "{prompt}");
            }
            backend.answer(call, requests)
        })
        .unwrap();
        assert!(out[0].is_some() && out[1].is_none() && out[2].is_some());
        // More than one context's worth: several rounds, each fewer prompts.
        assert!(rounds.len() >= 2, "{rounds:?}");
        assert!(rounds.windows(2).all(|w| w[1] < w[0]), "{rounds:?}");
        // A row that fits no prompt fails its group alone, named.
        let groups = [vec!["y".repeat(400)], rows[..2].to_vec()];
        let out = reduce_groups(&calls, 300, &groups, |c, r| backend.answer(c, r)).unwrap();
        let Some(Answer::Failed(e)) = &out[0] else {
            panic!("{:?}", out[0]);
        };
        assert!(e.contains("400 bytes"), "{e}");
        assert!(matches!(out[1], Some(Answer::Text(_))), "{:?}", out[1]);
    }
}
