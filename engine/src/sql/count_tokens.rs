//! `ai_count_tokens`: the prompt tokens of one AI call, counted with the
//! model's tokenizer and no model (Snowflake's `AI_COUNT_TOKENS`, BigQuery's
//! `AI.COUNT_TOKENS`).
//!
//! - `ai_count_tokens(text)`: the tokens of `text` alone;
//! - `ai_count_tokens(template, doc [, partner])`: the tokens of the prompt an
//!   `ai_filter(template, doc [, partner])` call asks of that row in the
//!   session's prompt format, its pieces tokenized as the scheduler tokenizes
//!   them (so the count is the positions the model reads). A NULL argument
//!   gives NULL.

use std::sync::{Arc, OnceLock};

use aisql_models::Tokenizer;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};

use crate::inference::backend::AiKind;
use crate::inference::kinds::call_pieces;
use crate::inference::prompt::{PromptFormat, PromptPieces};

/// The function's name in SQL.
pub const NAME: &str = "ai_count_tokens";

/// The `ai_count_tokens` scalar function of a session.
#[derive(Debug)]
pub struct CountTokens {
    signature: Signature,
    format: PromptFormat,
}

/// The vendored tokenizer, read once per process when a statement first
/// counts: reading it takes a good part of a second and tens of MB, which
/// a session (every server connection is one) that never counts is spared.
fn vendored() -> DfResult<&'static Tokenizer> {
    static VENDORED: OnceLock<std::result::Result<Tokenizer, String>> = OnceLock::new();
    VENDORED
        .get_or_init(|| Tokenizer::vendored().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| DataFusionError::Execution(format!("{NAME}: reading the tokenizer: {e}")))
}

impl CountTokens {
    /// Counts with the vendored tokenizer, rendering prompts in `format`.
    pub fn new(format: PromptFormat) -> Self {
        let text = || DataType::Utf8;
        Self {
            signature: Signature::one_of(
                vec![
                    TypeSignature::Exact(vec![text()]),
                    TypeSignature::Exact(vec![text(), text()]),
                    TypeSignature::Exact(vec![text(), text(), text()]),
                ],
                Volatility::Immutable,
            ),
            format,
        }
    }

    fn count(&self, text: &str) -> DfResult<i64> {
        if text.is_empty() {
            return Ok(0);
        }
        let ids = vendored()?
            .encode(text)
            .map_err(|e| DataFusionError::Execution(format!("{NAME}: {e}")))?;
        Ok(ids.len() as i64)
    }

    /// The prompt pieces of `template` over one document or a pair.
    fn pieces(&self, template: &str, pair: bool) -> DfResult<PromptPieces> {
        call_pieces(self.format, AiKind::Filter, template, pair, &[], &[])
            .map_err(|e| DataFusionError::Plan(format!("{NAME}: {e}")))
    }
}

impl PartialEq for CountTokens {
    fn eq(&self, other: &Self) -> bool {
        self.format == other.format
    }
}

impl Eq for CountTokens {}

impl std::hash::Hash for CountTokens {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        NAME.hash(state);
        self.format.name().hash(state);
    }
}

impl ScalarUDFImpl for CountTokens {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let columns: Vec<ArrayRef> = args
            .args
            .iter()
            .map(|a| {
                let array = a.to_array(rows)?;
                Ok(cast(&array, &DataType::Utf8)?)
            })
            .collect::<DfResult<_>>()?;
        let texts: Vec<_> = columns.iter().map(|c| c.as_string::<i32>()).collect();
        // A constant template (the usual case) is rendered once.
        let mut rendered: Option<(String, PromptPieces, [i64; 4])> = None;
        let mut out = Vec::with_capacity(rows);
        for row in 0..rows {
            if texts.iter().any(|t| t.is_null(row)) {
                out.push(None);
                continue;
            }
            let [first, docs @ ..] = texts.as_slice() else {
                unreachable!("the signature has one to three arguments")
            };
            if docs.is_empty() {
                out.push(Some(self.count(first.value(row))?));
                continue;
            }
            let template = first.value(row);
            if rendered.as_ref().is_none_or(|(t, _, _)| t != template) {
                let pieces = self.pieces(template, docs.len() == 2)?;
                let counts = [
                    self.count(&pieces.preamble)?,
                    self.count(&pieces.frame)?,
                    self.count(&pieces.label)?,
                    self.count(&pieces.tail)?,
                ];
                rendered = Some((template.to_string(), pieces, counts));
            }
            let (_, _, fixed) = rendered.as_ref().expect("rendered above");
            let documents = docs
                .iter()
                .map(|d| self.count(d.value(row)))
                .sum::<DfResult<i64>>()?;
            out.push(Some(fixed.iter().sum::<i64>() + documents));
        }
        Ok(ColumnarValue::Array(Arc::new(Int64Array::from(out))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    async fn counts(sql: &str) -> Vec<Option<i64>> {
        let ctx = SessionContext::new();
        ctx.register_udf(datafusion::logical_expr::ScalarUDF::new_from_impl(
            CountTokens::new(PromptFormat::default()),
        ));
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        batches
            .iter()
            .flat_map(|b| {
                let c = b
                    .column(0)
                    .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
                c.iter().collect::<Vec<_>>()
            })
            .collect()
    }

    #[tokio::test]
    async fn counts_a_text_and_a_filter_prompt_as_the_scheduler_reads_it() {
        let tok = Tokenizer::vendored().unwrap();
        let text = "The film was a delight from start to finish.";
        let alone = tok.encode(text).unwrap().len() as i64;
        assert_eq!(
            counts(&format!("SELECT ai_count_tokens('{text}')")).await,
            [Some(alone)]
        );
        let pieces = call_pieces(
            PromptFormat::default(),
            AiKind::Filter,
            "Is the review {0} positive?",
            false,
            &[],
            &[],
        )
        .unwrap();
        let want = [pieces.preamble.as_str(), text, pieces.tail.as_str()]
            .iter()
            .map(|p| tok.encode(p).unwrap().len() as i64)
            .sum::<i64>();
        let got = counts(&format!(
            "SELECT ai_count_tokens('Is the review {{0}} positive?', '{text}')"
        ))
        .await;
        assert_eq!(got, [Some(want)]);
        assert!(want > alone);
        assert_eq!(
            counts("SELECT ai_count_tokens(CAST(NULL AS VARCHAR))").await,
            [None]
        );
    }
}
