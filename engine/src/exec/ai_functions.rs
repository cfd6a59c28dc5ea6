//! The registry of AI functions ([`AI_FUNCTIONS`]) and their DataFusion scalar
//! functions: `ai_filter(template, doc [, partner])`, `ai_join(template, left,
//! right)`, `ai_classify(template, doc [, partner], labels, descriptions)`,
//! `ai_score(template, doc [, partner])`, `ai_classify_scores(...)` (as
//! `ai_classify`) and `ai_complete(template, doc [, partner] [, max_tokens])`,
//! whatever spelling or producer they came from (SQL, any Substrait plan).
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

use datafusion::arrow::array::{Array, ArrayRef, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::TreeNode;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion::prelude::SessionContext;

use crate::error::{EngineError, Result};
use crate::exec::answers::answer_array;
use crate::inference::backend::{
    AiCall, AiKind, AiRequest, Doc, InferenceBackend, ask_once, require_answered,
};
use crate::inference::field_type::FieldDecl;
use crate::inference::kinds::call_pieces;
use crate::inference::prompt::{PromptFormat, check_placeholders};

/// URN under which QUAIL-B plans, and aisql's Substrait for the functions they
/// use, declare the AI functions.
pub const AI_URN: &str = "extension:org.fsdatalab.quail_b:functions_ai";

/// Default `max_tokens` of a generating call.
pub const DEFAULT_MAX_TOKENS: u32 = 256;

/// One AI function: the registry's description of it. The planner rule, the
/// naive evaluator, the SQL spellings, Substrait and the backends all read a
/// call through this one entry; adding a function is an entry here and its
/// tests, and, for a new kind of answer, the kind ([`crate::inference::kinds`]).
#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AiFunction {
    /// The registered (lowercase) name.
    pub name: &'static str,
    /// Other names SQL and Substrait resolve to it.
    pub aliases: &'static [&'static str],
    /// The question one call over one document asks. An `ai_filter` over two
    /// documents asks [`AiKind::Join`].
    pub kind: AiKind,
    /// The fewest and most documents.
    pub documents: (usize, usize),
    /// Whether a template comes first (every function but `ai_extract`,
    /// whose questions are its fields).
    pub template: bool,
    /// Whether labels and their descriptions follow the documents.
    pub labels: bool,
    /// Whether a list of `'name: question'` fields follows the documents.
    pub fields: bool,
    /// Whether an integer `max_tokens` may end the arguments, and its
    /// default (0: not a generating function).
    pub max_tokens: u32,
    /// The accepted arguments, for errors.
    pub arity: &'static str,
    /// Whether it is an aggregate (its document is a column's rows, grouped).
    pub aggregate: bool,
    /// Whether it embeds its document (`ai_embed`): an optional instruction
    /// literal, then optional integer `dims`, follow it; the instruction is
    /// the call's template and the dimensions its `max_tokens`.
    pub embeds: bool,
    /// Whether a type literal comes first (`ai_generate('INT', ...)`): the
    /// SQL type of its answers ([`crate::inference::field_type`]), decoded
    /// in that type's grammar.
    pub returns_type: bool,
    /// The URN of the Substrait extension that declares it: QUAIL-B's for the
    /// functions its plans call, aisql's ([`AISQL_AI_URN`]) for the others.
    pub urn: &'static str,
}

/// URN of the extension declaring aisql's own AI functions
/// (`engine/src/sql/export/functions_ai.yaml`).
pub const AISQL_AI_URN: &str = "extension:aisql:functions_ai";

/// Every AI function.
pub static AI_FUNCTIONS: [AiFunction; 9] = [
    AiFunction {
        name: "ai_filter",
        aliases: &[],
        kind: AiKind::Filter,
        documents: (1, 2),
        template: true,
        labels: false,
        fields: false,
        max_tokens: 0,
        arity: "(template, document) or (template, document, partner)",
        aggregate: false,
        embeds: false,
        returns_type: false,
        urn: AI_URN,
    },
    AiFunction {
        name: "ai_join",
        aliases: &[],
        kind: AiKind::Join,
        documents: (2, 2),
        template: true,
        labels: false,
        fields: false,
        max_tokens: 0,
        arity: "(template, left document, right document)",
        aggregate: false,
        embeds: false,
        returns_type: false,
        urn: AI_URN,
    },
    AiFunction {
        name: "ai_classify",
        aliases: &[],
        kind: AiKind::Classify,
        documents: (1, 2),
        template: true,
        labels: true,
        fields: false,
        max_tokens: 0,
        arity: "(template, document [, partner], [labels...], [descriptions...])",
        aggregate: false,
        embeds: false,
        returns_type: false,
        urn: AI_URN,
    },
    AiFunction {
        name: "ai_score",
        aliases: &["ai_filter_score"],
        kind: AiKind::Score,
        documents: (1, 2),
        template: true,
        labels: false,
        fields: false,
        max_tokens: 0,
        arity: "(template, document [, partner])",
        aggregate: false,
        embeds: false,
        returns_type: false,
        urn: AI_URN,
    },
    AiFunction {
        name: "ai_classify_scores",
        aliases: &[],
        kind: AiKind::ClassifyScores,
        documents: (1, 2),
        template: true,
        labels: true,
        fields: false,
        max_tokens: 0,
        arity: "(template, document [, partner], [labels...], [descriptions...])",
        aggregate: false,
        embeds: false,
        returns_type: false,
        urn: AISQL_AI_URN,
    },
    AiFunction {
        name: "ai_complete",
        aliases: &[],
        kind: AiKind::Complete,
        documents: (1, 2),
        template: true,
        labels: false,
        fields: false,
        max_tokens: DEFAULT_MAX_TOKENS,
        arity: "(template, document [, partner] [, max_tokens])",
        aggregate: false,
        embeds: false,
        returns_type: false,
        urn: AISQL_AI_URN,
    },
    AiFunction {
        name: "ai_generate",
        aliases: &[],
        kind: AiKind::Complete,
        documents: (1, 2),
        template: true,
        labels: false,
        fields: false,
        max_tokens: DEFAULT_MAX_TOKENS,
        arity: "(returns, template, document [, partner] [, max_tokens])",
        aggregate: false,
        embeds: false,
        returns_type: true,
        urn: AISQL_AI_URN,
    },
    AiFunction {
        name: "ai_extract",
        aliases: &[],
        kind: AiKind::Extract,
        documents: (1, 1),
        template: false,
        labels: false,
        fields: true,
        max_tokens: DEFAULT_EXTRACT_TOKENS,
        arity: "(document, ['name: question', ...] [, max_tokens])",
        aggregate: false,
        embeds: false,
        returns_type: false,
        urn: AISQL_AI_URN,
    },
    AiFunction {
        name: "ai_embed",
        aliases: &[],
        kind: AiKind::Embed,
        documents: (1, 1),
        template: false,
        labels: false,
        fields: false,
        max_tokens: 0,
        arity: "(text [, 'instruction'] [, dims])",
        aggregate: false,
        embeds: true,
        returns_type: false,
        urn: AISQL_AI_URN,
    },
];

/// The aggregate AI functions (`ai_agg`), described like the others.
pub static AI_AGGREGATES: [AiFunction; 1] = [AiFunction {
    name: "ai_agg",
    aliases: &[],
    kind: AiKind::Complete,
    documents: (1, 1),
    template: true,
    labels: false,
    fields: false,
    max_tokens: DEFAULT_MAX_TOKENS,
    arity: "(instruction, column [, max_tokens])",
    aggregate: true,
    embeds: false,
    returns_type: false,
    urn: AISQL_AI_URN,
}];

/// Default `max_tokens` of one extracted field: fields are short answers.
pub const DEFAULT_EXTRACT_TOKENS: u32 = 64;

impl AiFunction {
    /// The function a name or alias stands for (case-insensitive, as SQL
    /// resolves it).
    pub fn from_name(name: &str) -> Option<&'static Self> {
        AI_FUNCTIONS.iter().chain(&AI_AGGREGATES).find(|f| {
            f.name.eq_ignore_ascii_case(name)
                || f.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
        })
    }

    /// The question a call with `documents` documents asks: a TRUE/FALSE
    /// question about one document is a filter, about two a join.
    pub fn kind(&self, documents: usize) -> AiKind {
        match (self.kind, documents) {
            (AiKind::Filter, 2) => AiKind::Join,
            (kind, _) => kind,
        }
    }

    /// Whether a call's last argument is its `max_tokens`: a generating call
    /// of more than two arguments whose last is a number (a document is text).
    pub fn ends_with_max_tokens(&self, args: usize, last_is_number: bool) -> bool {
        if self.embeds {
            // An embedding's `dims`: after the text (and the instruction).
            return args > 1 && last_is_number;
        }
        self.max_tokens > 0 && args > 2 + usize::from(self.returns_type) && last_is_number
    }

    /// Arguments before the documents: the type, if it takes one, then the
    /// template, if it takes one.
    pub fn leading(&self) -> usize {
        usize::from(self.returns_type) + usize::from(self.template)
    }

    /// Where the template is among the arguments (after the type).
    pub fn template_at(&self) -> usize {
        usize::from(self.returns_type)
    }

    /// The template's place, for errors.
    pub fn template_place(&self) -> String {
        match self.template_at() {
            0 => "first argument".to_string(),
            at => format!("argument {}", at + 1),
        }
    }

    /// How many arguments are documents, for `args` arguments (the last a
    /// number or not).
    pub fn documents(
        &self,
        args: usize,
        last_is_number: bool,
    ) -> std::result::Result<usize, String> {
        let trailing = usize::from(self.ends_with_max_tokens(args, last_is_number));
        if self.embeds {
            // The text, an optional instruction, optional dims.
            return match args.checked_sub(trailing) {
                Some(1 | 2) => Ok(1),
                _ => Err(format!(
                    "{} takes {}, not {args} argument(s)",
                    self.name, self.arity
                )),
            };
        }
        let fixed =
            self.leading() + if self.labels { 2 } else { 0 } + usize::from(self.fields) + trailing;
        let (low, high) = self.documents;
        match args.checked_sub(fixed) {
            Some(docs) if (low..=high).contains(&docs) => Ok(docs),
            _ => Err(format!(
                "{} takes {}, not {args} argument(s)",
                self.name, self.arity
            )),
        }
    }
}

/// The arguments of one AI call, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct AiArgs {
    /// Which function.
    pub function: &'static AiFunction,
    /// Prompt template with `{0}` (and `{1}`).
    pub template: String,
    /// The document expressions, `{0}` first.
    pub documents: Vec<Expr>,
    /// Classification labels, or an extraction's field names (empty
    /// otherwise).
    pub labels: Vec<String>,
    /// One description per label, or an extraction's question per field.
    pub descriptions: Vec<String>,
    /// Most tokens to generate (generating functions; 0 otherwise).
    pub max_tokens: u32,
}

impl AiArgs {
    /// Parses `function(args)`. Errors say what is wrong without position; the
    /// caller adds where the call is.
    pub fn parse(
        function: &'static AiFunction,
        args: &[Expr],
    ) -> std::result::Result<Self, String> {
        if function.embeds {
            return Self::parse_embed(function, args);
        }
        let name = function.name;
        let last_is_number = args
            .last()
            .is_some_and(|e| string_literal(e).is_none() && is_literal(e));
        let trailing = function.ends_with_max_tokens(args.len(), last_is_number);
        let documents = function.documents(args.len(), last_is_number)?;
        let first = function.leading();
        let after = first + documents;
        let template = if function.template {
            let at = function.template_at();
            let template = string_literal(&args[at]).ok_or_else(|| {
                format!(
                    "{name}: the template ({}) must be a string literal, not {}",
                    function.template_place(),
                    args[at]
                )
            })?;
            // An aggregate's instruction names no document: its rows are the text.
            let placeholders = if function.aggregate { 0 } else { documents };
            check_placeholders(&template, placeholders).map_err(|m| format!("{name}: {m}"))?;
            template
        } else {
            String::new()
        };
        let (labels, descriptions) = if function.labels {
            let list = |e: &Expr, what: &str| {
                string_list(e).ok_or_else(|| {
                    format!(
                        "{name}: the {what} must be a list of string literals such as ['a', 'b'], not {e}"
                    )
                })
            };
            let labels = list(&args[after], "labels")?;
            let descriptions = list(&args[after + 1], "descriptions")?;
            check_label_list(name, &labels, &descriptions)?;
            (labels, descriptions)
        } else if function.fields {
            parse_fields(name, after + 1, &args[after])?
        } else if function.returns_type {
            (vec![parse_returns(name, &args[0])?], Vec::new())
        } else {
            (Vec::new(), Vec::new())
        };
        let max_tokens = if trailing {
            max_tokens_literal(name, args.len(), &args[args.len() - 1])?
        } else {
            function.max_tokens
        };
        Ok(Self {
            function,
            template,
            documents: args[first..after].to_vec(),
            labels,
            descriptions,
            max_tokens,
        })
    }

    /// `ai_embed(text [, 'instruction'] [, dims])`. `dims` left out is 0
    /// until [`Self::resolve_dims`] sets the model's.
    fn parse_embed(
        function: &'static AiFunction,
        args: &[Expr],
    ) -> std::result::Result<Self, String> {
        let name = function.name;
        let last_is_number = args
            .last()
            .is_some_and(|e| string_literal(e).is_none() && is_literal(e));
        function.documents(args.len(), last_is_number)?;
        let trailing = function.ends_with_max_tokens(args.len(), last_is_number);
        let instruction = match &args[1..args.len() - usize::from(trailing)] {
            [] => String::new(),
            [e] => string_literal(e).ok_or_else(|| {
                // Snowflake's AI_EMBED('model', text) reads as a literal text
                // and a column instruction: say which form aisql reads.
                let snowflake = if string_literal(&args[0]).is_some() {
                    " (Snowflake's AI_EMBED('model', text) is not read: write \
                     ai_embed(text [, 'instruction'] [, dims]), which embeds with the \
                     loaded model)"
                } else {
                    ""
                };
                format!(
                    "{name}: the instruction (argument 2) must be a string literal, not \
                     {e}{snowflake}"
                )
            })?,
            _ => unreachable!("documents() allows one instruction at most"),
        };
        let dims = if trailing {
            let e = &args[args.len() - 1];
            let value = match e {
                Expr::Negative(n) => integer_literal(n).map(|v| -v),
                e => integer_literal(e),
            };
            match value {
                Some(v) if (1..=i128::from(MAX_EMBEDDING_DIMS)).contains(&v) => v as u32,
                _ => {
                    return Err(format!(
                        "{name}: dims (argument {}) must be a positive integer literal of at \
                         most {MAX_EMBEDDING_DIMS}, not {e}",
                        args.len()
                    ));
                }
            }
        } else {
            0
        };
        Ok(Self {
            function,
            template: instruction,
            documents: vec![args[0].clone()],
            labels: Vec::new(),
            descriptions: Vec::new(),
            max_tokens: dims,
        })
    }

    /// Sets an embedding's dimensions to the embedding model's `model` (its
    /// hidden size) where the call gave none, and checks the ones it gave fit
    /// them. Other calls are left as they are.
    pub fn resolve_dims(&mut self, model: Option<u32>) -> std::result::Result<(), String> {
        if !self.function.embeds {
            return Ok(());
        }
        let name = self.function.name;
        match (self.max_tokens, model) {
            (0, Some(m)) => self.max_tokens = m,
            (0, None) => {
                return Err(format!(
                    "{name}: no dims given, and the backend has no embedding model whose \
                     size would be the default; give dims"
                ));
            }
            (d, Some(m)) if d > m => {
                return Err(format!(
                    "{name}: dims {d} is more than the embedding model's {m} dimensions"
                ));
            }
            _ => {}
        }
        Ok(())
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
        let pieces = if self.function.aggregate {
            // The first round's: the group's rows, then the instruction.
            crate::exec::ai_aggregate::round_pieces(format, &self.template, false)
        } else {
            call_pieces(
                format,
                kind,
                &self.template,
                self.documents.len() > 1,
                &self.labels,
                &self.descriptions,
            )?
        };
        Ok(AiCall {
            op_id: op_id.to_string(),
            kind,
            template: self.template.clone(),
            tables,
            columns,
            pieces,
            labels: self.labels.clone(),
            max_tokens: self.max_tokens,
            descriptions: kind
                .describe()
                .travelling_descriptions(format, &self.descriptions),
            relations: Vec::new(),
        })
    }
}

/// An extraction's fields (argument number `position`): a list of
/// `'name: question'` or `'name TYPE: question'` strings
/// ([`FieldDecl`]), names unique and non-empty. Returns the canonical
/// declarations and the questions.
fn parse_fields(
    name: &str,
    position: usize,
    e: &Expr,
) -> std::result::Result<(Vec<String>, Vec<String>), String> {
    let bad = |why: String| {
        format!(
            "{name}: the fields (argument {position}) must be a list of 'name: question' \
             strings such as ['price: What does it cost?']; {why}"
        )
    };
    // SQL's ['a: q', ...] reaches the planner as one JSON-array string
    // (`crate::sql::spelling`), so that the call's type can name the fields.
    let list = string_list(e)
        .or_else(|| serde_json::from_str(&string_literal(e)?).ok())
        .ok_or_else(|| bad(format!("not {e}")))?;
    if list.is_empty() {
        return Err(bad("the list is empty".into()));
    }
    let mut names: Vec<String> = Vec::with_capacity(list.len());
    let mut questions = Vec::with_capacity(list.len());
    let mut declared = Vec::with_capacity(list.len());
    for (i, field) in list.iter().enumerate() {
        let Some((n, q)) = field.split_once(':') else {
            return Err(bad(format!("field {} ({field:?}) has no ':'", i + 1)));
        };
        let (n, q) = (n.trim(), q.trim());
        if n.is_empty() || q.is_empty() {
            return Err(bad(format!(
                "field {} ({field:?}) has an empty name or question",
                i + 1
            )));
        }
        if n.contains(" JSON ") {
            return Err(bad(format!(
                "field {}: a JSON answer is asked with ai_generate('JSON {{schema}}', ...), \
                 as a field's ':' would cut its schema",
                i + 1
            )));
        }
        // `name` or `name TYPE`: the label holds the canonical declaration.
        let decl = FieldDecl::parse(n).map_err(|e| bad(format!("field {}: {e}", i + 1)))?;
        if declared
            .iter()
            .any(|d: &FieldDecl| d.name.eq_ignore_ascii_case(&decl.name))
        {
            return Err(bad(format!("field name {:?} comes twice", decl.name)));
        }
        names.push(decl.to_string());
        declared.push(decl);
        questions.push(q.to_string());
    }
    Ok((names, questions))
}

/// A typed generation's type (its first argument): a string literal naming
/// a field type other than text; returns its canonical spelling, the
/// call's one label.
fn parse_returns(name: &str, e: &Expr) -> std::result::Result<String, String> {
    let bad = |why: String| {
        format!(
            "{name}: the type (argument 1) must be a string literal such as 'INT', 'DOUBLE', \
             'BOOLEAN', 'DATE' or 'ENUM(a, b)'; {why}"
        )
    };
    let spelled = string_literal(e).ok_or_else(|| bad(format!("not {e}")))?;
    let decl = FieldDecl::parse(&format!("answer {spelled}")).map_err(bad)?;
    if decl.name != "answer" || decl.ty.is_text() {
        return Err(bad(format!("{spelled:?} is not one")));
    }
    Ok(decl.ty.to_string())
}

/// Whether `e` is a literal (possibly cast).
fn is_literal(e: &Expr) -> bool {
    match e {
        Expr::Literal(..) => true,
        Expr::Cast(c) => is_literal(&c.expr),
        Expr::TryCast(c) => is_literal(&c.expr),
        Expr::Negative(n) => is_literal(n),
        _ => false,
    }
}

/// A `max_tokens` argument (argument number `position`): a positive integer
/// literal no larger than any model's context.
fn max_tokens_literal(name: &str, position: usize, e: &Expr) -> std::result::Result<u32, String> {
    let value = match e {
        Expr::Negative(n) => integer_literal(n).map(|v| -v),
        e => integer_literal(e),
    };
    let bad = || {
        format!(
            "{name}: max_tokens (argument {position}) must be a positive integer literal of at \
             most {MAX_TOKENS_LIMIT}, not {e}"
        )
    };
    match value {
        Some(v) if (1..=i128::from(MAX_TOKENS_LIMIT)).contains(&v) => Ok(v as u32),
        _ => Err(bad()),
    }
}

/// The most dimensions an `ai_embed` may ask for (Qwen3-Embedding-8B has
/// 4,096; a model's own size bounds it further when the call is planned).
pub const MAX_EMBEDDING_DIMS: u32 = 65_536;

/// The most tokens a call may ask to generate: the longest context of any
/// Qwen3 (a call over the loaded model's context fails when it runs, naming
/// that context).
pub const MAX_TOKENS_LIMIT: u32 = 131_072;

fn integer_literal(e: &Expr) -> Option<i128> {
    match e {
        Expr::Literal(v, _) => match v {
            ScalarValue::Int8(Some(v)) => Some(i128::from(*v)),
            ScalarValue::Int16(Some(v)) => Some(i128::from(*v)),
            ScalarValue::Int32(Some(v)) => Some(i128::from(*v)),
            ScalarValue::Int64(Some(v)) => Some(i128::from(*v)),
            ScalarValue::UInt8(Some(v)) => Some(i128::from(*v)),
            ScalarValue::UInt16(Some(v)) => Some(i128::from(*v)),
            ScalarValue::UInt32(Some(v)) => Some(i128::from(*v)),
            ScalarValue::UInt64(Some(v)) => Some(i128::from(*v)),
            _ => None,
        },
        Expr::Cast(c) => integer_literal(&c.expr),
        Expr::TryCast(c) => integer_literal(&c.expr),
        _ => None,
    }
}

/// Labels: at least two, one description each, and told apart by an answer:
/// none the same as another up to case and spacing, none continuing another
/// word for word (the answer "very" would be read as both "very" and "very
/// good").
fn check_label_list(
    name: &str,
    labels: &[String],
    descriptions: &[String],
) -> std::result::Result<(), String> {
    if labels.len() < 2 {
        return Err(format!("{name} needs at least two labels"));
    }
    if labels.len() != descriptions.len() {
        return Err(format!(
            "{name}: {} labels but {} descriptions",
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
            return Err(format!("{name}: label {} is empty", i + 1));
        }
        if let Some(j) = folded[..i].iter().position(|g| g == f) {
            return Err(format!(
                "{name}: labels {:?} and {l:?} are the same",
                labels[j]
            ));
        }
    }
    for a in &folded {
        for b in &folded {
            if b.len() > a.len() && b.starts_with(a.as_str()) && b[a.len()..].starts_with(' ') {
                return Err(format!(
                    "{name}: label {b:?} continues label {a:?} word for word"
                ));
            }
        }
    }
    Ok(())
}

/// The AI function an expression calls, with its arguments.
pub fn ai_call_of(e: &Expr) -> Option<(&'static AiFunction, &[Expr])> {
    match e {
        Expr::ScalarFunction(ScalarFunction { func, args }) => {
            let udf = func.inner().downcast_ref::<AiUdf>()?;
            Some((udf.function, args.as_slice()))
        }
        _ => None,
    }
}

/// The embedding dimensions the AI function `e` calls defaults to, if it
/// is one and its session has a model.
pub fn embedding_dims_of(e: &Expr) -> Option<u32> {
    match e {
        Expr::ScalarFunction(ScalarFunction { func, .. }) => {
            func.inner().downcast_ref::<AiUdf>()?.embedding_dims
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
    function: &'static AiFunction,
    aliases: Vec<String>,
    signature: Signature,
    naive: Option<NaiveEvaluator>,
    /// The embedding model's dimensions (`ai_embed` without dims), if the
    /// session has a model.
    embedding_dims: Option<u32>,
}

impl PartialEq for AiUdf {
    fn eq(&self, other: &Self) -> bool {
        self.function == other.function
            && self.embedding_dims == other.embedding_dims
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
    /// The function, evaluated row by row by `naive` if given; an embedding
    /// without dims has `embedding_dims`.
    pub fn new(
        function: &'static AiFunction,
        naive: Option<NaiveEvaluator>,
        embedding_dims: Option<u32>,
    ) -> Self {
        Self {
            function,
            aliases: function.aliases.iter().map(|a| a.to_string()).collect(),
            signature: Signature::variadic_any(Volatility::Immutable),
            naive,
            embedding_dims,
        }
    }
}

impl ScalarUDFImpl for AiUdf {
    fn name(&self) -> &str {
        self.function.name
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(self.function.kind.return_type(&[], 0))
    }

    /// An extraction's struct has one field per `'name: question'`: read
    /// from the fields argument, a literal by the time the call is typed.
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        if self.function.embeds {
            // The dims are a literal (or the model's) by the time the call is typed.
            let exprs: Vec<Expr> = args
                .scalar_arguments
                .iter()
                .map(|v| match v {
                    Some(v) => Expr::Literal((*v).clone(), None),
                    None => Expr::Column(datafusion::common::Column::from_name("text")),
                })
                .collect();
            let mut parsed = AiArgs::parse(self.function, &exprs).map_err(DataFusionError::Plan)?;
            if parsed.max_tokens == 0 && self.embedding_dims.is_none() {
                // No model sizes it (`--to-substrait` loads none): a list of
                // any length, so the plan can be written; running it needs a
                // model, and the AI rewrite says so.
                return Ok(Arc::new(Field::new(
                    self.name(),
                    DataType::new_list(DataType::Float32, true),
                    true,
                )));
            }
            parsed
                .resolve_dims(self.embedding_dims)
                .map_err(DataFusionError::Plan)?;
            return Ok(Arc::new(Field::new(
                self.name(),
                self.function.kind.return_type(&[], parsed.max_tokens),
                true,
            )));
        }
        let names = if self.function.fields {
            let at = self.function.leading() + 1;
            let value = args.scalar_arguments.get(at).copied().flatten();
            let literal = value.map(|v| Expr::Literal(v.clone(), None));
            match literal.map(|e| parse_fields(self.function.name, at + 1, &e)) {
                Some(Ok((names, _))) => names,
                Some(Err(m)) => return Err(DataFusionError::Plan(m)),
                None => {
                    return Err(DataFusionError::Plan(format!(
                        "{}: the fields (argument {}) must be a list of 'name: question' \
                         string literals",
                        self.function.name,
                        at + 1
                    )));
                }
            }
        } else if self.function.returns_type {
            // The type is a literal by the time the call is typed.
            let value = args.scalar_arguments.first().copied().flatten();
            let literal = value.map_or(Expr::Literal(ScalarValue::Null, None), |v| {
                Expr::Literal(v.clone(), None)
            });
            vec![parse_returns(self.function.name, &literal).map_err(DataFusionError::Plan)?]
        } else {
            Vec::new()
        };
        Ok(Arc::new(Field::new(
            self.name(),
            self.function.kind.return_type(&names, 0),
            true,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let Some(naive) = &self.naive else {
            return Err(DataFusionError::Plan(format!(
                "{} was left as a row-by-row function: AI calls are planned as AI operators, \
                 and this one was in a place the planner does not rewrite",
                self.function.name
            )));
        };
        naive_eval(self.function, naive, self.embedding_dims, args).map_err(DataFusionError::from)
    }
}

/// Registers the AI functions on `ctx`; `ai_embed` without dims has
/// `embedding_dims` (the model's hidden size), if known.
pub fn register_ai_functions(
    ctx: &SessionContext,
    naive: Option<NaiveEvaluator>,
    embedding_dims: Option<u32>,
) {
    for f in &AI_FUNCTIONS {
        ctx.register_udf(ScalarUDF::new_from_impl(AiUdf::new(
            f,
            naive.clone(),
            embedding_dims,
        )));
    }
    ctx.register_udaf(datafusion::logical_expr::AggregateUDF::new_from_impl(
        crate::exec::ai_aggregate::AiAggUdf::new(naive),
    ));
}

/// One row at a time: the reference semantics of an AI call. A NULL document
/// gives a NULL answer.
fn naive_eval(
    function: &'static AiFunction,
    naive: &NaiveEvaluator,
    embedding_dims: Option<u32>,
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
    let mut parsed = AiArgs::parse(function, &exprs).map_err(EngineError::Sql)?;
    parsed
        .resolve_dims(embedding_dims)
        .map_err(EngineError::Sql)?;
    // Documents are columns here; the parse above only checked the shape.
    let first = function.leading();
    let docs: Vec<ArrayRef> = args.args[first..first + parsed.documents.len()]
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
    let mut answers = Vec::with_capacity(rows);
    for row in 0..rows {
        if docs.iter().any(|d| d.is_null(row)) {
            answers.push(None);
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
        // Each row a query of its own: the reference reuses nothing.
        let answer = ask_once(&naive.backend, &call, &[request])?;
        answers.push(require_answered(answer)?.into_iter().next());
    }
    Ok(ColumnarValue::Array(answer_array(&call, &answers)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{col, lit};

    fn f(name: &str) -> &'static AiFunction {
        AiFunction::from_name(name).unwrap()
    }

    fn udf(f: &'static AiFunction) -> Arc<ScalarUDF> {
        Arc::new(ScalarUDF::new_from_impl(AiUdf::new(f, None, None)))
    }

    #[test]
    fn parses_each_function() {
        let args = vec![lit("Is {0} kind?"), col("body")];
        let a = AiArgs::parse(f("ai_filter"), &args).unwrap();
        assert_eq!(a.kind(), AiKind::Filter);
        let args = vec![lit("Does {0} cite {1}?"), col("a"), col("b")];
        assert_eq!(
            AiArgs::parse(f("ai_filter"), &args).unwrap().kind(),
            AiKind::Join
        );
        assert_eq!(
            AiArgs::parse(f("ai_join"), &args).unwrap().kind(),
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
        let a = AiArgs::parse(f("ai_classify"), &args).unwrap();
        assert_eq!(a.labels, ["pos", "neg"]);
    }

    #[test]
    fn rejects_bad_calls() {
        let e = AiArgs::parse(f("ai_join"), &[lit("{0}"), col("a")]).unwrap_err();
        assert!(e.contains("ai_join takes"), "{e}");
        let e = AiArgs::parse(f("ai_filter"), &[lit("no placeholder"), col("a")]).unwrap_err();
        assert!(e.contains("no {0} placeholder"), "{e}");
        let e = AiArgs::parse(f("ai_filter"), &[lit("{0} and {1}"), col("a")]).unwrap_err();
        assert!(e.contains("more placeholders"), "{e}");
        let e = AiArgs::parse(f("ai_filter"), &[col("t"), col("a")]).unwrap_err();
        assert!(e.contains("string literal"), "{e}");
    }

    #[test]
    fn finds_calls_in_expressions() {
        let call = Expr::ScalarFunction(ScalarFunction::new_udf(
            udf(f("ai_filter")),
            vec![lit("{0}?"), col("x")],
        ));
        assert!(ai_call_of(&call).is_some());
        assert!(contains_ai_call(&!call.clone()));
        assert!(!contains_ai_call(&col("x").eq(lit("y"))));
    }
}
