//! The AI functions as DataFusion scalar functions: `ai_filter(template, doc
//! [, partner])`, `ai_join(template, left, right)` and `ai_classify(template, doc
//! [, partner], labels, descriptions)`, whatever spelling or producer they came
//! from (SQL, any Substrait plan).
//!
//! They are registered so that SQL and Substrait resolve them by name; the
//! analyzer rule ([`crate::sql::rewrite`]) then turns every call into an AI
//! operator that batches its prompts. A call left in a plan is evaluated row by
//! row only when the functions were registered with a [`NaiveEvaluator`] — the
//! reference the differential tests compare the AI operators with. Otherwise
//! evaluating one is an error: the engine never asks a model one row at a time
//! by accident.
//!
//! [`AiArgs`] is the one parser of a call's arguments (template, documents,
//! labels): the rule and the naive evaluator both use it.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::TreeNode;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

use crate::backend::{AiCall, AiKind, AiRequest, Doc, InferenceBackend};
use crate::error::{EngineError, Result};
use crate::prompt::{
    PromptFormat, check_placeholders, classify_pieces, filter_pieces, join_pieces,
    pair_classify_pieces,
};

/// URN under which QUAIL-B plans declare the AI functions.
pub use crate::plan::AI_URN;

/// One of the three AI functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AiFunction {
    /// `ai_filter(template, doc [, partner]) -> bool`.
    Filter,
    /// `ai_join(template, left, right) -> bool`.
    Join,
    /// `ai_classify(template, doc [, partner], labels, descriptions) -> label`.
    Classify,
}

impl AiFunction {
    /// Every AI function.
    pub const ALL: [AiFunction; 3] = [AiFunction::Filter, AiFunction::Join, AiFunction::Classify];

    /// The registered name.
    pub fn name(self) -> &'static str {
        match self {
            AiFunction::Filter => "ai_filter",
            AiFunction::Join => "ai_join",
            AiFunction::Classify => "ai_classify",
        }
    }

    /// The function a name stands for (case-insensitive, as SQL resolves it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(name))
    }

    /// The question a call with `documents` documents asks: a TRUE/FALSE
    /// question about one document is a filter, about two a join.
    pub fn kind(self, documents: usize) -> AiKind {
        match (self, documents) {
            (AiFunction::Classify, _) => AiKind::Classify,
            (_, 1) => AiKind::Filter,
            _ => AiKind::Join,
        }
    }

    /// What a call returns.
    pub fn return_type(self) -> DataType {
        match self {
            AiFunction::Classify => DataType::Utf8,
            _ => DataType::Boolean,
        }
    }

    /// The accepted argument counts, for errors.
    pub fn arity(self) -> &'static str {
        match self {
            AiFunction::Filter => "(template, document) or (template, document, partner)",
            AiFunction::Join => "(template, left document, right document)",
            AiFunction::Classify => {
                "(template, document [, partner], [labels...], [descriptions...])"
            }
        }
    }

    /// How many arguments are documents, for `args` arguments in all.
    pub fn documents(self, args: usize) -> std::result::Result<usize, String> {
        let docs = match self {
            AiFunction::Filter if (2..=3).contains(&args) => args - 1,
            AiFunction::Join if args == 3 => 2,
            AiFunction::Classify if (4..=5).contains(&args) => args - 3,
            _ => {
                return Err(format!(
                    "{} takes {}, not {args} argument(s)",
                    self.name(),
                    self.arity()
                ));
            }
        };
        Ok(docs)
    }
}

/// The arguments of one AI call, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct AiArgs {
    /// Which function.
    pub function: AiFunction,
    /// Prompt template with `{0}` (and `{1}`).
    pub template: String,
    /// The document expressions, `{0}` first.
    pub documents: Vec<Expr>,
    /// Classification labels (empty otherwise).
    pub labels: Vec<String>,
    /// One description per label.
    pub descriptions: Vec<String>,
}

impl AiArgs {
    /// Parses `function(args)`. Errors say what is wrong without position; the
    /// caller adds where the call is.
    pub fn parse(function: AiFunction, args: &[Expr]) -> std::result::Result<Self, String> {
        let documents = function.documents(args.len())?;
        let template = string_literal(&args[0]).ok_or_else(|| {
            format!(
                "{}: the template (first argument) must be a string literal, not {}",
                function.name(),
                args[0]
            )
        })?;
        check_placeholders(&template, documents)
            .map_err(|m| format!("{}: {m}", function.name()))?;
        let (labels, descriptions) = if function == AiFunction::Classify {
            let list = |e: &Expr, what: &str| {
                string_list(e).ok_or_else(|| {
                    format!(
                        "ai_classify: the {what} must be a list of string literals such as ['a', 'b'], not {e}"
                    )
                })
            };
            let labels = list(&args[documents + 1], "labels")?;
            let descriptions = list(&args[documents + 2], "descriptions")?;
            check_label_list(&labels, &descriptions)?;
            (labels, descriptions)
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(Self {
            function,
            template,
            documents: args[1..=documents].to_vec(),
            labels,
            descriptions,
        })
    }

    /// The question kind.
    pub fn kind(&self) -> AiKind {
        self.function.kind(self.documents.len())
    }

    /// The call as a backend sees it, for operator `op_id` over documents of
    /// `tables`/`columns`.
    pub fn call(
        &self,
        op_id: &str,
        format: PromptFormat,
        tables: Vec<String>,
        columns: Vec<String>,
    ) -> Result<AiCall> {
        let kind = self.kind();
        let pieces = match kind {
            AiKind::Filter => filter_pieces(format, &self.template)?,
            AiKind::Join => join_pieces(format, &self.template),
            AiKind::Classify if self.documents.len() == 1 => {
                classify_pieces(format, &self.template, &self.labels, &self.descriptions)?
            }
            AiKind::Classify => {
                pair_classify_pieces(format, &self.template, &self.labels, &self.descriptions)
            }
        };
        Ok(AiCall {
            op_id: op_id.to_string(),
            kind,
            template: self.template.clone(),
            tables,
            columns,
            pieces,
            labels: self.labels.clone(),
            descriptions: self.descriptions.clone(),
            relations: Vec::new(),
        })
    }
}

/// Labels: at least two, one description each, and told apart by an answer:
/// none the same as another up to case and spacing, none continuing another
/// word for word (the answer "very" would be read as both "very" and "very
/// good").
fn check_label_list(labels: &[String], descriptions: &[String]) -> std::result::Result<(), String> {
    if labels.len() < 2 {
        return Err("ai_classify needs at least two labels".into());
    }
    if labels.len() != descriptions.len() {
        return Err(format!(
            "ai_classify: {} labels but {} descriptions",
            labels.len(),
            descriptions.len()
        ));
    }
    let fold = |s: &str| {
        s.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase()
    };
    let folded: Vec<String> = labels.iter().map(|l| fold(l)).collect();
    for (i, (l, f)) in labels.iter().zip(&folded).enumerate() {
        if f.is_empty() {
            return Err(format!("ai_classify: label {} is empty", i + 1));
        }
        if let Some(j) = folded[..i].iter().position(|g| g == f) {
            return Err(format!(
                "ai_classify: labels {:?} and {l:?} are the same",
                labels[j]
            ));
        }
    }
    for a in &folded {
        for b in &folded {
            if b.len() > a.len() && b.starts_with(a.as_str()) && b[a.len()..].starts_with(' ') {
                return Err(format!(
                    "ai_classify: label {b:?} continues label {a:?} word for word"
                ));
            }
        }
    }
    Ok(())
}

/// The AI function an expression calls, with its arguments.
pub fn ai_call_of(e: &Expr) -> Option<(AiFunction, &[Expr])> {
    match e {
        Expr::ScalarFunction(ScalarFunction { func, args }) => {
            func.inner().downcast_ref::<AiUdf>()?;
            Some((AiFunction::from_name(func.name())?, args.as_slice()))
        }
        _ => None,
    }
}

/// Whether `e` calls an AI function anywhere.
pub fn contains_ai_call(e: &Expr) -> bool {
    e.exists(|e| Ok(ai_call_of(e).is_some())).unwrap_or(false)
}

fn string_literal(e: &Expr) -> Option<String> {
    match e {
        Expr::Literal(v, _) => scalar_string(v),
        Expr::Cast(c) => string_literal(&c.expr),
        Expr::TryCast(c) => string_literal(&c.expr),
        _ => None,
    }
}

fn scalar_string(v: &ScalarValue) -> Option<String> {
    match v {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Some(s.clone()),
        _ => None,
    }
}

/// A list of string literals: `make_array('a', 'b')` as SQL plans `['a', 'b']`,
/// or a list literal (Substrait, constant folding).
fn string_list(e: &Expr) -> Option<Vec<String>> {
    match e {
        Expr::ScalarFunction(f) if f.func.name() == "make_array" => {
            f.args.iter().map(string_literal).collect()
        }
        Expr::Literal(v, _) => scalar_list(v),
        Expr::Cast(c) => string_list(&c.expr),
        _ => None,
    }
}

fn scalar_list(v: &ScalarValue) -> Option<Vec<String>> {
    let values: ArrayRef = match v {
        ScalarValue::List(a) => a.value(0),
        ScalarValue::LargeList(a) => a.value(0),
        ScalarValue::FixedSizeList(a) => a.value(0),
        _ => return None,
    };
    let values = cast(&values, &DataType::Utf8).ok()?;
    let strings = values.as_any().downcast_ref::<StringArray>()?;
    (0..strings.len())
        .map(|i| strings.is_valid(i).then(|| strings.value(i).to_string()))
        .collect()
}

/// Evaluates AI calls row by row with a backend: the naive reference the AI
/// operators are tested against, never the engine's own path.
#[derive(Clone)]
pub struct NaiveEvaluator {
    /// Asked once per row.
    pub backend: Arc<dyn InferenceBackend>,
    /// Prompt layout.
    pub format: PromptFormat,
}

impl std::fmt::Debug for NaiveEvaluator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NaiveEvaluator({})", self.backend.name())
    }
}

/// One AI function as a DataFusion scalar function.
#[derive(Debug)]
pub struct AiUdf {
    function: AiFunction,
    signature: Signature,
    naive: Option<NaiveEvaluator>,
}

impl PartialEq for AiUdf {
    fn eq(&self, other: &Self) -> bool {
        self.function == other.function
            && match (&self.naive, &other.naive) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(&a.backend, &b.backend),
                _ => false,
            }
    }
}

impl Eq for AiUdf {}

impl Hash for AiUdf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.function.hash(state);
        self.naive.is_some().hash(state);
    }
}

impl AiUdf {
    /// The function, evaluated row by row by `naive` if given.
    pub fn new(function: AiFunction, naive: Option<NaiveEvaluator>) -> Self {
        Self {
            function,
            signature: Signature::variadic_any(Volatility::Immutable),
            naive,
        }
    }
}

impl ScalarUDFImpl for AiUdf {
    fn name(&self) -> &str {
        self.function.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(self.function.return_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let Some(naive) = &self.naive else {
            return Err(DataFusionError::Plan(format!(
                "{} was left as a row-by-row function: AI calls are planned as AI operators, \
                 and this one was in a place the planner does not rewrite",
                self.function.name()
            )));
        };
        naive_eval(self.function, naive, args).map_err(DataFusionError::from)
    }
}

/// Registers the three AI functions on `ctx`.
pub fn register_ai_functions(ctx: &SessionContext, naive: Option<NaiveEvaluator>) {
    for f in AiFunction::ALL {
        ctx.register_udf(ScalarUDF::new_from_impl(AiUdf::new(f, naive.clone())));
    }
}

/// One row at a time: the reference semantics of an AI call. A NULL document
/// gives a NULL answer.
fn naive_eval(
    function: AiFunction,
    naive: &NaiveEvaluator,
    args: ScalarFunctionArgs,
) -> Result<ColumnarValue> {
    let rows = args.number_rows;
    let exprs: Vec<Expr> = args
        .args
        .iter()
        .map(|a| match a {
            ColumnarValue::Scalar(s) if !matches!(s, ScalarValue::Utf8(None)) => {
                Expr::Literal(s.clone(), None)
            }
            // A document: its values are read below.
            _ => Expr::Literal(ScalarValue::Utf8(Some(String::new())), None),
        })
        .collect();
    let parsed = AiArgs::parse(function, &exprs).map_err(EngineError::Sql)?;
    // Documents are columns here; the parse above only checked the shape.
    let docs: Vec<ArrayRef> = args.args[1..=parsed.documents.len()]
        .iter()
        .map(|a| {
            let array = a.to_array(rows)?;
            Ok(cast(&array, &DataType::Utf8)?)
        })
        .collect::<Result<_>>()?;
    let docs: Vec<&StringArray> = docs
        .iter()
        .map(|a| {
            a.as_any()
                .downcast_ref::<StringArray>()
                .expect("cast to Utf8")
        })
        .collect();
    let call = parsed.call(
        "naive",
        naive.format,
        vec![String::new(); docs.len()],
        vec![String::new(); docs.len()],
    )?;
    let mut bools = Vec::with_capacity(rows);
    let mut labels = Vec::with_capacity(rows);
    for row in 0..rows {
        if docs.iter().any(|d| d.is_null(row)) {
            bools.push(None);
            labels.push(None);
            continue;
        }
        fn doc(d: &StringArray, row: usize) -> Doc<'_> {
            Doc {
                id: d.value(row),
                text: d.value(row),
            }
        }
        let request = AiRequest {
            anchor: doc(docs[0], row),
            partner: docs.get(1).map(|d| doc(d, row)),
        };
        if call.kind == AiKind::Classify {
            let chosen = naive.backend.classify(&call, &[request])?;
            labels.push(Some(call.labels[chosen[0]].clone()));
        } else {
            bools.push(Some(naive.backend.decide(&call, &[request])?[0]));
        }
    }
    Ok(ColumnarValue::Array(if call.kind == AiKind::Classify {
        Arc::new(StringArray::from(labels))
    } else {
        Arc::new(BooleanArray::from(bools))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{col, lit};

    fn udf(f: AiFunction) -> Arc<ScalarUDF> {
        Arc::new(ScalarUDF::new_from_impl(AiUdf::new(f, None)))
    }

    #[test]
    fn parses_each_function() {
        let args = vec![lit("Is {0} kind?"), col("body")];
        let a = AiArgs::parse(AiFunction::Filter, &args).unwrap();
        assert_eq!(a.kind(), AiKind::Filter);
        let args = vec![lit("Does {0} cite {1}?"), col("a"), col("b")];
        assert_eq!(
            AiArgs::parse(AiFunction::Filter, &args).unwrap().kind(),
            AiKind::Join
        );
        assert_eq!(
            AiArgs::parse(AiFunction::Join, &args).unwrap().kind(),
            AiKind::Join
        );
        let labels = Expr::Literal(
            ScalarValue::List(ScalarValue::new_list_nullable(
                &[ScalarValue::from("pos"), ScalarValue::from("neg")],
                &DataType::Utf8,
            )),
            None,
        );
        let args = vec![lit("Tone of {0}?"), col("body"), labels.clone(), labels];
        let a = AiArgs::parse(AiFunction::Classify, &args).unwrap();
        assert_eq!(a.labels, ["pos", "neg"]);
    }

    #[test]
    fn rejects_bad_calls() {
        let e = AiArgs::parse(AiFunction::Join, &[lit("{0}"), col("a")]).unwrap_err();
        assert!(e.contains("ai_join takes"), "{e}");
        let e = AiArgs::parse(AiFunction::Filter, &[lit("no placeholder"), col("a")]).unwrap_err();
        assert!(e.contains("no {0} placeholder"), "{e}");
        let e = AiArgs::parse(AiFunction::Filter, &[lit("{0} and {1}"), col("a")]).unwrap_err();
        assert!(e.contains("more placeholders"), "{e}");
        let e = AiArgs::parse(AiFunction::Filter, &[col("t"), col("a")]).unwrap_err();
        assert!(e.contains("string literal"), "{e}");
    }

    #[test]
    fn finds_calls_in_expressions() {
        let call = Expr::ScalarFunction(ScalarFunction::new_udf(
            udf(AiFunction::Filter),
            vec![lit("{0}?"), col("x")],
        ));
        assert!(ai_call_of(&call).is_some());
        assert!(contains_ai_call(&!call.clone()));
        assert!(!contains_ai_call(&col("x").eq(lit("y"))));
    }
}
