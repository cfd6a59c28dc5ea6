//! The SQL spellings of the AI functions, brought to one form before planning.
//!
//! | spelling | example | becomes |
//! |---|---|---|
//! | QUAIL-B | `ai_filter('Is {0} kind?', r.body)` | itself |
//! | Snowflake | `AI_FILTER(PROMPT('Is {0} kind?', r.body))` | `ai_filter('Is {0} kind?', r.body)` |
//! | BigQuery | `AI.IF(('Is ', r.body, ' kind?'))` | `ai_filter('Is {0} kind?', r.body)` |
//! | BigQuery | `AI.SCORE(('Rate ', r.body))` | `ai_score('Rate {0}', r.body)` |
//! | BigQuery | `AI.GENERATE(('Summarise ', r.body))` | `ai_complete('Summarise {0}', r.body)` |
//! | BigQuery | `AI.GENERATE_INT(('Year of ', r.body))` (`_DOUBLE`, `_BOOL`) | `ai_generate('INT', 'Year of {0}', r.body)` |
//! | BigQuery | `AI.GENERATE(('Facts of ', r.body), output_schema => 'name STRING, age INT64')` | `ai_generate('STRUCT<name VARCHAR, age INT>', 'Facts of {0}', r.body)` |
//! | aisql | `ai_complete('Year of {0}', r.body, returns => 'INT')` | `ai_generate('INT', 'Year of {0}', r.body)` |
//! | Snowflake | `AI_COMPLETE('qwen3-4b', PROMPT('Summarise {0}', r.body))` | `ai_complete('Summarise {0}', r.body)`, the model checked against the loaded one |
//! | Snowflake | `AI_COMPLETE('qwen3-4b', PROMPT('Facts of {0}', r.body), response_format => {'type': 'json', 'schema': {...}})` | `ai_generate('JSON {...}', 'Facts of {0}', r.body)` (the schema as JSON; also given as a string of JSON) |
//! | Snowflake | `AI_SIMILARITY(a.body, b.body)` | `vector_cosine_similarity(ai_embed(a.body), ai_embed(b.body))` |
//!
//! A BigQuery prompt tuple's strings are concatenated with each other element
//! replaced by `{i}` in order. The checks that need the call's place in the text
//! (an unknown AI spelling, the number of arguments, placeholders against
//! documents) happen here, so their errors give line and column; everything else
//! is checked by the planner rule ([`super::rewrite`]).

use std::collections::HashMap;
use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, Function, FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments, Ident,
    ObjectName, ObjectNamePart, Query, Spanned, Value, Visit, Visitor, visit_expressions_mut,
};

use crate::error::{EngineError, Result};
use crate::exec::ai_functions::{AiFunction, MAX_TOKENS_LIMIT};
use crate::inference::field_type::{FieldDecl, FieldType};
use crate::inference::prompt::check_placeholders;

/// Where each AI call's template first appears in the SQL text: the planner
/// rule names it in its errors.
pub type CallSites = HashMap<String, String>;

/// The spellings aisql reads, for errors.
const KNOWN: &str = "ai_filter(template, doc), ai_join(template, left, right), \
ai_classify(template, doc, [labels], [descriptions]), ai_score(template, doc), \
ai_classify_scores(template, doc, [labels], [descriptions]), \
ai_complete(template, doc [, max_tokens] [, returns => type]), \
AI_COMPLETE(model, PROMPT(...) [, response_format => {'type': 'json', 'schema': {...}}]), \
ai_generate(type, template, doc [, max_tokens]), ai_embed(text [, instruction] [, dims]), \
ai_similarity(text, text), AI_FILTER(PROMPT(template, doc...)), \
AI_COMPLETE(model, PROMPT(template, doc...)), AI.IF((text, column, text...)), \
AI.SCORE((...)), AI.GENERATE((...) [, output_schema => 'name TYPE, ...']), AI.GENERATE_INT/_DOUBLE/_BOOL((...)), ai_count_tokens(template, doc) or (text), \
AI_COUNT_TOKENS('ai_filter', PROMPT(...)) and AI.COUNT_TOKENS((...))";

/// What normalizing a statement found: where each AI call's template is, and
/// the models its Snowflake `AI_COMPLETE` calls name (with their places), to be
/// checked against the loaded model.
#[derive(Debug, Default)]
pub struct Spelled {
    /// Template → place in the text.
    pub sites: CallSites,
    /// (model named, the call and its place in the text) of each
    /// `AI_COMPLETE(model, ...)` and `AI_COUNT_TOKENS(function, model, ...)`.
    pub models: Vec<(String, String)>,
}

/// Deepest nesting of expressions and subqueries accepted. DataFusion's planner
/// recurses once per level (a chain of 3,000 `AND`s takes more than 8 MiB of
/// stack, so aisql plans on threads with large stacks) and its simplifier takes
/// time quadratic in the depth (a 2,200-deep chain of `-` took 11 s to plan in a
/// debug build): deeper statements get an error, not a crash or a stall.
pub const MAX_NESTING: usize = 1_000;

/// Deepest nesting of subqueries inside expressions (scalar subqueries,
/// `EXISTS`, `IN (SELECT ...)`, each within the last): DataFusion's check of a
/// plan's subqueries takes time doubling with each such level (16 levels took
/// 20 s to plan in a debug build, 20 more than a minute). Subqueries in `FROM`
/// nest freely.
pub const MAX_SUBQUERY_NESTING: usize = 12;

/// Counts nesting while the AST is walked.
struct Depth {
    now: usize,
    /// Expression subqueries open.
    subqueries: usize,
}

/// Whether `e` holds a subquery.
fn is_subquery(e: &Expr) -> bool {
    matches!(
        e,
        Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. }
    )
}

impl Depth {
    fn enter(&mut self) -> ControlFlow<EngineError> {
        self.now += 1;
        if self.now > MAX_NESTING {
            return ControlFlow::Break(sql_error(format!(
                "the statement nests expressions or subqueries more than {MAX_NESTING} levels deep \
                 (a long chain of OR or AND is one level per term; use IN (...) for long lists)"
            )));
        }
        ControlFlow::Continue(())
    }

    fn leave(&mut self) -> ControlFlow<EngineError> {
        self.now -= 1;
        ControlFlow::Continue(())
    }
}

impl Visitor for Depth {
    type Break = EngineError;

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<EngineError> {
        if is_subquery(e) {
            self.subqueries += 1;
            if self.subqueries > MAX_SUBQUERY_NESTING {
                return ControlFlow::Break(sql_error(format!(
                    "the statement nests subqueries in expressions (scalar, EXISTS, IN) more \
                     than {MAX_SUBQUERY_NESTING} levels deep{}; DataFusion's planning time \
                     doubles with each level (a join or a CTE does the same work)",
                    at(e)
                )));
            }
        }
        self.enter()
    }

    fn post_visit_expr(&mut self, e: &Expr) -> ControlFlow<EngineError> {
        if is_subquery(e) {
            self.subqueries -= 1;
        }
        self.leave()
    }

    fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<EngineError> {
        self.enter()
    }

    fn post_visit_query(&mut self, _: &Query) -> ControlFlow<EngineError> {
        self.leave()
    }
}

/// Rewrites every AI call of `statement` to the QUAIL-B spelling, checking each;
/// returns where each template is.
pub fn normalize(statement: &mut DfStatement) -> Result<Spelled> {
    if let DfStatement::Statement(s) = statement
        && let ControlFlow::Break(e) = s.visit(&mut Depth {
            now: 0,
            subqueries: 0,
        })
    {
        return Err(e);
    }
    let mut spelled = Spelled::default();
    match statement {
        DfStatement::Statement(s) => visit(s.as_mut(), &mut spelled)?,
        DfStatement::Explain(e) => return normalize(e.statement.as_mut()),
        _ => {}
    }
    Ok(spelled)
}

fn visit(
    statement: &mut datafusion::sql::sqlparser::ast::Statement,
    sites: &mut Spelled,
) -> Result<()> {
    let flow = visit_expressions_mut(statement, |e| match normalize_expr(e, sites) {
        Ok(()) => ControlFlow::Continue(()),
        Err(err) => ControlFlow::Break(err),
    });
    match flow {
        ControlFlow::Break(e) => Err(e),
        ControlFlow::Continue(()) => Ok(()),
    }
}

fn at(e: &impl Spanned) -> String {
    let start = e.span().start;
    if start.line == 0 {
        String::new()
    } else {
        format!(" at line {}, column {}", start.line, start.column)
    }
}

fn sql_error(message: String) -> EngineError {
    EngineError::Sql(message)
}

fn name_parts(name: &ObjectName) -> Vec<String> {
    name.0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(i) => i.value.to_lowercase(),
            ObjectNamePart::Function(_) => String::new(),
        })
        .collect()
}

/// The positional arguments of a call; named ones are refused.
fn positional(f: &Function, spelling: &str) -> Result<Vec<Expr>> {
    let FunctionArguments::List(list) = &f.args else {
        return Ok(Vec::new());
    };
    list.args
        .iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e.clone()),
            other => Err(sql_error(format!(
                "{spelling}{}: argument {other} is not supported (aisql's model is chosen with --model)",
                at(f)
            ))),
        })
        .collect()
}

fn string_literal(e: &Expr) -> Option<&str> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => Some(s),
            _ => None,
        },
        Expr::Nested(inner) => string_literal(inner),
        _ => None,
    }
}

fn call(name: &str, span_of: &Function, args: Vec<Expr>) -> Expr {
    let mut ident = Ident::new(name);
    ident.span = span_of.name.span();
    Expr::Function(Function {
        name: ObjectName(vec![ObjectNamePart::Identifier(ident)]),
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|e| FunctionArg::Unnamed(FunctionArgExpr::Expr(e)))
                .collect(),
            clauses: Vec::new(),
        }),
        ..span_of.clone()
    })
}

/// `ai_complete(args...)` made `ai_generate('ty', args...)`.
fn typed(complete: Expr, ty: &str) -> Expr {
    let Expr::Function(mut f) = complete else {
        return complete;
    };
    if let Some(ObjectNamePart::Identifier(ident)) = f.name.0.first_mut() {
        ident.value = "ai_generate".to_string();
    }
    if let FunctionArguments::List(list) = &mut f.args {
        list.args.insert(
            0,
            FunctionArg::Unnamed(FunctionArgExpr::Expr(literal(ty.to_string()))),
        );
    }
    Expr::Function(f)
}

/// The named arguments that give a completion's answer type: aisql's
/// `returns => 'TYPE'` and Snowflake's `response_format => {...}`.
const ANSWER_TYPE_ARGUMENTS: [&str; 2] = ["returns", "response_format"];

/// The name of `a` when it is a named argument (`name => value`).
fn argument_name(a: &FunctionArg) -> Option<&str> {
    match a {
        FunctionArg::Named { name, .. } => Some(&name.value),
        FunctionArg::ExprNamed {
            name: Expr::Identifier(name),
            ..
        } => Some(&name.value),
        _ => None,
    }
}

/// The name and value of `a` when it is a named argument whose value is an
/// expression.
fn named_argument(a: &FunctionArg) -> Option<(&str, &Expr)> {
    match a {
        FunctionArg::Named {
            arg: FunctionArgExpr::Expr(e),
            ..
        }
        | FunctionArg::ExprNamed {
            arg: FunctionArgExpr::Expr(e),
            ..
        } => Some((argument_name(a)?, e)),
        _ => None,
    }
}

fn is_answer_type_argument(a: &FunctionArg) -> bool {
    argument_name(a).is_some_and(|n| {
        ANSWER_TYPE_ARGUMENTS
            .iter()
            .any(|t| n.eq_ignore_ascii_case(t))
    })
}

/// BigQuery's field access on a call, `AI.GENERATE(...).result` or
/// `AI.GENERATE(..., output_schema => ...).age` (parsed as `AI` accessed by
/// the call, then by the field): the normalized call, `.result` of a text
/// answer being the answer itself and a struct's `.name` its field. `None`
/// when `e` is no such access.
fn bigquery_field_access(e: &Expr, found: &mut Spelled) -> Result<Option<Expr>> {
    use datafusion::sql::sqlparser::ast::{AccessExpr, Subscript};
    let Expr::CompoundFieldAccess { root, access_chain } = e else {
        return Ok(None);
    };
    let (Expr::Identifier(ai), [AccessExpr::Dot(Expr::Function(f)), rest @ ..]) =
        (root.as_ref(), access_chain.as_slice())
    else {
        return Ok(None);
    };
    if !ai.value.eq_ignore_ascii_case("ai") {
        return Ok(None);
    }
    let mut call = f.clone();
    call.name
        .0
        .insert(0, ObjectNamePart::Identifier(ai.clone()));
    let spelled = call.name.to_string();
    let mut call = Expr::Function(call);
    normalize_expr(&mut call, found)?;
    // A struct answer (output_schema) is its fields; any other is BigQuery's
    // struct of result, full_response and status, of which aisql gives the
    // result (a failed row is an error or NULL).
    let is_struct = match &call {
        Expr::Function(Function {
            args: FunctionArguments::List(l),
            ..
        }) => matches!(
            l.args.first(),
            Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(t)))
                if string_literal(t).is_some_and(|t| t.starts_with("STRUCT<"))
        ),
        _ => false,
    };
    let mut fields = rest.iter();
    if !is_struct {
        match fields.next() {
            Some(AccessExpr::Dot(Expr::Identifier(r)))
                if r.value.eq_ignore_ascii_case("result") => {}
            Some(other) => {
                return Err(sql_error(format!(
                    "{spelled}(...){other}{}: aisql gives .result only (no full_response or \
                     status: a row that fails is an error, or NULL under --on-row-error null)",
                    at(f)
                )));
            }
            None => {}
        }
    }
    // A struct's fields by name, as DataFusion reads them.
    let chain: Vec<AccessExpr> = fields
        .map(|a| match a {
            AccessExpr::Dot(Expr::Identifier(name)) => AccessExpr::Subscript(Subscript::Index {
                index: literal(name.value.clone()),
            }),
            other => other.clone(),
        })
        .collect();
    Ok(Some(match chain.is_empty() {
        true => call,
        false => Expr::CompoundFieldAccess {
            root: Box::new(call),
            access_chain: chain,
        },
    }))
}

/// BigQuery's `AI.GENERATE(prompt, output_schema => 'name STRING, age
/// INT64')`: the call without the argument, and the struct type it names
/// (checked here, so that its error has the call's place).
fn output_schema_argument(f: &Function) -> Result<(Function, Option<FieldType>)> {
    let mut plain = f.clone();
    let FunctionArguments::List(list) = &mut plain.args else {
        return Ok((plain, None));
    };
    let is_schema =
        |a: &FunctionArg| argument_name(a).is_some_and(|n| n.eq_ignore_ascii_case("output_schema"));
    let given: Vec<FunctionArg> = list.args.iter().filter(|a| is_schema(a)).cloned().collect();
    list.args.retain(|a| !is_schema(a));
    let bad = |why: String| sql_error(format!("AI.GENERATE{}: output_schema => {why}", at(f)));
    let value = match given.as_slice() {
        [] => return Ok((plain, None)),
        [one] => named_argument(one)
            .map(|(_, e)| e)
            .ok_or_else(|| bad("takes a string literal".into()))?,
        _ => return Err(bad("is given more than once".into())),
    };
    let fields = string_literal(value).ok_or_else(|| {
        bad(format!(
            "takes the fields as a string literal such as 'name STRING, age INT64', not {value}"
        ))
    })?;
    let ty = FieldDecl::parse(&format!("answer STRUCT<{fields}>"))
        .map_err(|e| bad(e.replace("\"answer STRUCT<", "\"STRUCT<")))?
        .ty;
    Ok((plain, Some(ty)))
}

/// The answer type a call's `returns => 'TYPE'` or `response_format => ...`
/// names (`None` when it has neither).
fn answer_type_argument(f: &Function, spelled: &str) -> Result<Option<String>> {
    let FunctionArguments::List(list) = &f.args else {
        return Ok(None);
    };
    let given: Vec<(&str, &Expr)> = list
        .args
        .iter()
        .filter(|a| is_answer_type_argument(a))
        .filter_map(named_argument)
        .collect();
    let (name, value) = match given.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        _ => {
            return Err(sql_error(format!(
                "{spelled}{}: give the answer's type once (returns => or response_format =>)",
                at(f)
            )));
        }
    };
    if name.eq_ignore_ascii_case("returns") {
        return string_literal(value)
            .map(|t| Some(t.to_string()))
            .ok_or_else(|| {
                sql_error(format!(
                    "{spelled}{}: returns => takes a type as a string literal such as 'INT', \
                     not {value}",
                    at(f)
                ))
            });
    }
    response_format_type(value)
        .map(Some)
        .map_err(|m| sql_error(format!("{spelled}{}: response_format => {m}", at(f))))
}

/// Snowflake's response format, `{'type': 'json', 'schema': {...}}` (an object
/// constant, or a string of JSON), as aisql's type `JSON {schema}`.
fn response_format_type(value: &Expr) -> std::result::Result<String, String> {
    let format = match string_literal(value) {
        Some(text) => {
            serde_json::from_str(text).map_err(|e| format!("is a string that is not JSON ({e})"))?
        }
        None => literal_json(value)?,
    };
    let fields = format
        .as_object()
        .ok_or_else(|| format!("takes {{'type': 'json', 'schema': {{...}}}}, not {format}"))?;
    match fields.get("type").and_then(|t| t.as_str()) {
        Some(t) if t.eq_ignore_ascii_case("json") => {}
        _ => {
            return Err(format!(
                "needs 'type': 'json' (the one format Snowflake defines), in {format}"
            ));
        }
    }
    if let Some(other) = fields
        .keys()
        .find(|k| !matches!(k.as_str(), "type" | "schema"))
    {
        return Err(format!(
            "has an unknown key '{other}' (it reads 'type' and 'schema')"
        ));
    }
    match fields.get("schema") {
        Some(schema @ serde_json::Value::Object(_)) => Ok(format!("JSON {schema}")),
        _ => Err(format!(
            "needs a 'schema' that is a JSON schema object, in {format}"
        )),
    }
}

/// A constant written in SQL (`{'key': value}` objects, `[...]` arrays,
/// strings, numbers, booleans, NULL) as JSON.
fn literal_json(e: &Expr) -> std::result::Result<serde_json::Value, String> {
    use datafusion::sql::sqlparser::ast::UnaryOperator;
    use serde_json::Value as Json;
    let number = |n: &str| -> std::result::Result<Json, String> {
        serde_json::from_str::<serde_json::Number>(n)
            .map(Json::Number)
            .map_err(|_| format!("{n} is not a JSON number"))
    };
    Ok(match e {
        Expr::Dictionary(fields) => Json::Object(
            fields
                .iter()
                .map(|f| Ok((f.key.value.clone(), literal_json(&f.value)?)))
                .collect::<std::result::Result<_, String>>()?,
        ),
        Expr::Array(array) => Json::Array(
            array
                .elem
                .iter()
                .map(literal_json)
                .collect::<std::result::Result<_, String>>()?,
        ),
        Expr::Nested(inner) => literal_json(inner)?,
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match expr.as_ref() {
            Expr::Value(v) if matches!(v.value, Value::Number(..)) => {
                number(&format!("-{}", v.value))?
            }
            other => return Err(format!("-{other} is not a constant")),
        },
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => Json::String(s.clone()),
            Value::Number(n, _) => number(n)?,
            Value::Boolean(b) => Json::Bool(*b),
            Value::Null => Json::Null,
            other => return Err(format!("{other} is not a JSON value")),
        },
        other => return Err(format!("{other} is not a constant")),
    })
}

fn literal(s: String) -> Expr {
    Expr::value(Value::SingleQuotedString(s))
}

fn normalize_expr(e: &mut Expr, found: &mut Spelled) -> Result<()> {
    if let Some(accessed) = bigquery_field_access(e, found)? {
        *e = accessed;
        return Ok(());
    }
    let Expr::Function(f) = e else {
        return Ok(());
    };
    let parts = name_parts(&f.name);
    let spelled = f.name.to_string();
    let answer_type = match parts.as_slice() {
        [name] if name == "ai_complete" => answer_type_argument(f, &spelled)?,
        _ => None,
    };
    let replacement = match parts.as_slice() {
        [ai, op] if ai == "ai" => match op.as_str() {
            "if" => Some(bigquery_prompt(f, "AI.IF", "ai_filter", 2)?),
            "score" => Some(bigquery_prompt(f, "AI.SCORE", "ai_score", 2)?),
            "generate" => {
                let (plain, fields) = output_schema_argument(f)?;
                let complete = bigquery_prompt(&plain, "AI.GENERATE", "ai_complete", 2)?;
                Some(match fields {
                    Some(fields) => typed(complete, &fields.to_string()),
                    None => complete,
                })
            }
            "generate_int" | "generate_double" | "generate_bool" => {
                let ty = match op.as_str() {
                    "generate_int" => "INT",
                    "generate_double" => "DOUBLE",
                    _ => "BOOLEAN",
                };
                let spelled = format!("AI.{}", op.to_ascii_uppercase());
                Some(typed(bigquery_prompt(f, &spelled, "ai_complete", 2)?, ty))
            }
            "count_tokens" => Some(bigquery_prompt(
                f,
                "AI.COUNT_TOKENS",
                super::count_tokens::NAME,
                2,
            )?),
            _ => {
                return Err(sql_error(format!(
                    "unknown AI function {spelled}{}; aisql reads {KNOWN}",
                    at(f)
                )));
            }
        },
        [_] if let Some(ty) = &answer_type => {
            // ai_complete(..., returns => 'INT'): ai_generate('INT', ...); the
            // rest of the call is read as it would be without the type.
            let mut plain = f.clone();
            if let FunctionArguments::List(l) = &mut plain.args {
                l.args.retain(|a| !is_answer_type_argument(a));
            }
            let mut untyped = Expr::Function(plain);
            normalize_expr(&mut untyped, found)?;
            Some(typed(untyped, ty))
        }
        [name] if name == "ai_summarize_agg" => {
            // Snowflake: AI_SUMMARIZE_AGG(column), a fixed instruction.
            let args = positional(f, &spelled)?;
            let [column] = args.as_slice() else {
                return Err(sql_error(format!(
                    "{spelled}{} takes one column, not {} arguments",
                    at(f),
                    args.len()
                )));
            };
            Some(call(
                "ai_agg",
                f,
                vec![
                    literal(crate::exec::ai_aggregate::SUMMARIZE_INSTRUCTION.to_string()),
                    column.clone(),
                ],
            ))
        }
        [name]
            if name == "ai_agg"
                && positional(f, &spelled).is_ok_and(|args| {
                    args.len() == 2
                        && string_literal(&args[0]).is_none()
                        && string_literal(&args[1]).is_some()
                }) =>
        {
            // Snowflake: AI_AGG(column, instruction).
            let mut args = positional(f, &spelled)?;
            args.swap(0, 1);
            Some(call("ai_agg", f, args))
        }
        [name] if name == "ai_similarity" => {
            // Snowflake: AI_SIMILARITY(a, b), the cosine of the texts' embeddings.
            let args = positional(f, &spelled)?;
            let [a, b] = args.as_slice() else {
                return Err(sql_error(format!(
                    "{spelled}{} takes two texts, not {} arguments",
                    at(f),
                    args.len()
                )));
            };
            let embed = |t: &Expr| call("ai_embed", f, vec![t.clone()]);
            Some(call(
                "vector_cosine_similarity",
                f,
                vec![embed(a), embed(b)],
            ))
        }
        [name] if name == super::count_tokens::NAME => {
            snowflake_count_tokens(f, &spelled, &mut found.models)?
        }
        [name] if name.starts_with("ai_") || name == "prompt" => {
            if name == "prompt" {
                return Ok(()); // checked where its AI_FILTER is
            }
            let function = AiFunction::from_name(name).ok_or_else(|| {
                sql_error(format!(
                    "unknown AI function {spelled}{}; aisql reads {KNOWN}",
                    at(f)
                ))
            })?;
            let args = positional(f, &spelled)?;
            let is_prompt =
                |e: &Expr| matches!(e, Expr::Function(p) if name_parts(&p.name) == ["prompt"]);
            match args.as_slice() {
                [Expr::Function(p)] if is_prompt(&args[0]) => {
                    if function.name != "ai_filter" {
                        return Err(sql_error(format!(
                            "{spelled}(PROMPT(...)){}: only AI_FILTER takes a PROMPT alone \
                             (AI_COMPLETE takes a model first)",
                            at(f)
                        )));
                    }
                    Some(call(function.name, f, positional(p, "PROMPT")?))
                }
                [model, rest @ ..]
                    if function.name == "ai_complete" && rest.iter().any(is_prompt) =>
                {
                    // Snowflake: AI_COMPLETE(model, PROMPT(...)[, options]).
                    let (Some(model), [Expr::Function(p)]) = (string_literal(model), rest) else {
                        return Err(sql_error(format!(
                            "{spelled}{}: Snowflake's form is AI_COMPLETE('model', PROMPT(template, \
                             column...)), a model name then one PROMPT",
                            at(f)
                        )));
                    };
                    found
                        .models
                        .push((model.to_string(), format!("AI_COMPLETE{}", at(f))));
                    Some(call(function.name, f, positional(p, "PROMPT")?))
                }
                _ => None,
            }
        }
        _ => return Ok(()),
    };
    if let Some(r) = replacement {
        *e = r;
    }
    let Expr::Function(f) = e else {
        return Ok(());
    };
    check_call(f, &mut found.sites)?;
    fields_as_one_literal(f);
    Ok(())
}

/// An `ai_extract`'s `['name: question', ...]` as one JSON-array string
/// literal: DataFusion plans an array as `make_array(...)`, a call whose
/// value is unknown when the call's type (a struct named by the fields) is
/// decided; a literal is known. The planner reads either form.
fn fields_as_one_literal(f: &mut Function) {
    let Some(function) = AiFunction::from_name(&f.name.to_string()).filter(|a| a.fields) else {
        return;
    };
    let FunctionArguments::List(list) = &mut f.args else {
        return;
    };
    let at = function.leading() + 1;
    let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))) = list.args.get_mut(at) else {
        return;
    };
    let Expr::Array(array) = arg else {
        return;
    };
    let strings: Option<Vec<&str>> = array.elem.iter().map(string_literal).collect();
    if let Some(strings) = strings {
        let json = serde_json::to_string(&strings).expect("strings serialise");
        *arg = literal(json);
    }
}

/// Snowflake's `AI_COUNT_TOKENS('ai_filter' [, 'model'], PROMPT(template,
/// column...))` as `ai_count_tokens(template, column...)`, and
/// `AI_COUNT_TOKENS('function' [, 'model'], text)` as `ai_count_tokens(text)`;
/// `None` for aisql's own form (a template or a text first). A model it
/// names joins `models`, to be checked against the loaded one (its
/// tokenizer is the one that counts).
fn snowflake_count_tokens(
    f: &Function,
    spelled: &str,
    models: &mut Vec<(String, String)>,
) -> Result<Option<Expr>> {
    let args = positional(f, spelled)?;
    let Some(function) = args
        .first()
        .and_then(string_literal)
        .filter(|n| AiFunction::from_name(&n.to_ascii_lowercase()).is_some())
    else {
        return Ok(None);
    };
    let rest = match &args[1..] {
        [model, rest @ ..] if !rest.is_empty() && string_literal(model).is_some() => {
            let name = string_literal(model).unwrap_or_default();
            models.push((name.to_string(), format!("AI_COUNT_TOKENS{}", at(f))));
            rest
        }
        rest => rest,
    };
    let is_prompt = |e: &Expr| matches!(e, Expr::Function(p) if name_parts(&p.name) == ["prompt"]);
    Ok(Some(match rest {
        [Expr::Function(p)] if is_prompt(&rest[0]) => {
            call(super::count_tokens::NAME, f, positional(p, "PROMPT")?)
        }
        [text] => call(super::count_tokens::NAME, f, vec![text.clone()]),
        _ => {
            return Err(sql_error(format!(
                "{spelled}('{function}', ...){}: Snowflake's form is AI_COUNT_TOKENS('function' \
                 [, 'model'], text or PROMPT(template, column...))",
                at(f)
            )));
        }
    }))
}

/// BigQuery's `AI.IF((text, column, text, ...))` and its kin: the prompt
/// tuple as a template of `target` over its columns (at most `most`).
fn bigquery_prompt(f: &Function, spelled: &str, target: &str, most: usize) -> Result<Expr> {
    let args = positional(f, spelled)?;
    let [prompt] = args.as_slice() else {
        return Err(sql_error(format!(
            "{spelled}{} takes one prompt, a string or a tuple such as ('Is ', col, ' kind?'), not {} arguments",
            at(f),
            args.len()
        )));
    };
    let parts: Vec<&Expr> = match prompt {
        Expr::Tuple(items) => items.iter().collect(),
        other => vec![other],
    };
    let mut template = String::new();
    let mut documents = Vec::new();
    for p in parts {
        match string_literal(p) {
            Some(s) => template.push_str(s),
            None => {
                template.push_str(&format!("{{{}}}", documents.len()));
                documents.push(p.clone());
            }
        }
    }
    if documents.is_empty() || documents.len() > most {
        return Err(sql_error(format!(
            "{spelled}{}: the prompt names {} column(s); it needs one document (or two, a pair)",
            at(f),
            documents.len()
        )));
    }
    let mut args = vec![literal(template)];
    args.extend(documents);
    Ok(call(target, f, args))
}

/// Whether `e` is a number literal (a generating call's `max_tokens`), signed
/// or not.
fn is_number(e: &Expr) -> bool {
    match e {
        Expr::Value(v) => matches!(v.value, Value::Number(..)),
        Expr::UnaryOp { expr, .. } | Expr::Nested(expr) => is_number(expr),
        _ => false,
    }
}

/// Arity and placeholders of a QUAIL-B-spelled call, with its position.
fn check_call(f: &Function, sites: &mut CallSites) -> Result<()> {
    let name = f.name.to_string();
    let Some(function) = AiFunction::from_name(&name) else {
        return Ok(());
    };
    let args = positional(f, &name)?;
    let documents = function
        .documents(args.len(), args.last().is_some_and(is_number))
        .map_err(|m| sql_error(format!("{m}{}", at(f))))?;
    check_max_tokens(f, function, &args)?;
    if let Some(inner) = args.iter().find(|a| calls_ai_aggregate(a)) {
        return Err(sql_error(format!(
            "{name}{}: an AI aggregate inside another call's argument ({inner}) is not \
             supported; aggregate in a subquery first",
            at(f)
        )));
    }
    if !function.template {
        return Ok(());
    }
    let t = function.template_at();
    let template = args.get(t).and_then(string_literal).ok_or_else(|| {
        sql_error(format!(
            "{name}{}: the template ({}) must be a string literal, not {}",
            at(f),
            function.template_place(),
            args.get(t).map_or("nothing".to_string(), |a| a.to_string())
        ))
    })?;
    if function.aggregate && template.contains("{0}") {
        return Err(sql_error(format!(
            "{name}{}: the instruction names no {{0}}: the group's rows are its text \
             (write e.g. 'Summarise the reviews above.')",
            at(f)
        )));
    }
    // An aggregate's instruction names no document: its rows are the text.
    let placeholders = if function.aggregate { 0 } else { documents };
    check_placeholders(template, placeholders)
        .map_err(|m| sql_error(format!("{name}{}: {m}", at(f))))?;
    sites.entry(template.to_string()).or_insert_with(|| at(f));
    Ok(())
}

/// Whether `e` calls an AI aggregate (`ai_agg`, Snowflake's spellings)
/// anywhere.
fn calls_ai_aggregate(e: &Expr) -> bool {
    use datafusion::sql::sqlparser::ast::visit_expressions;
    visit_expressions(e, |x| match x {
        Expr::Function(g)
            if AiFunction::from_name(&g.name.to_string()).is_some_and(|a| a.aggregate)
                || name_parts(&g.name) == ["ai_summarize_agg"] =>
        {
            ControlFlow::Break(())
        }
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

/// A generating call's `max_tokens`, when given: a positive integer no
/// larger than [`MAX_TOKENS_LIMIT`], with the call's place.
fn check_max_tokens(f: &Function, function: &AiFunction, args: &[Expr]) -> Result<()> {
    if !function.ends_with_max_tokens(args.len(), args.last().is_some_and(is_number)) {
        return Ok(());
    }
    let e = &args[args.len() - 1];
    let value = e.to_string().replace(' ', "").parse::<i128>().ok();
    if value.is_some_and(|v| (1..=i128::from(MAX_TOKENS_LIMIT)).contains(&v)) {
        return Ok(());
    }
    if function.embeds {
        // The planner checks dims against the model's size.
        return Ok(());
    }
    Err(sql_error(format!(
        "{}{}: max_tokens (argument {}) must be a positive integer of at most \
         {MAX_TOKENS_LIMIT}, not {e}",
        f.name,
        at(f),
        args.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalized(sql: &str) -> Result<String> {
        let state = datafusion::prelude::SessionContext::new().state();
        let mut s = super::super::parse_one(sql, &state)?;
        normalize(&mut s)?;
        Ok(s.to_string())
    }

    #[test]
    fn spellings_become_one() {
        let quail = normalized("SELECT id FROM t WHERE ai_filter('Is {0} kind?', body)").unwrap();
        let snow =
            normalized("SELECT id FROM t WHERE AI_FILTER(PROMPT('Is {0} kind?', body))").unwrap();
        let bq = normalized("SELECT id FROM t WHERE AI.IF(('Is ', body, ' kind?'))").unwrap();
        assert_eq!(quail, snow);
        assert_eq!(quail, bq);
    }

    /// BigQuery's output_schema is a STRUCT answer type, spelled
    /// canonically; a schema that is no struct is refused at the call.
    #[test]
    fn bigquery_output_schemas_become_struct_types() {
        let typed = normalized(
            "SELECT AI.GENERATE(('Facts of ', body), output_schema => \
             'name STRING, age INT64, tags ARRAY<STRING>, home STRUCT<city STRING, zip INT64>') \
             FROM t",
        )
        .unwrap();
        assert_eq!(
            typed,
            "SELECT ai_generate('STRUCT<name VARCHAR, age INT, tags ARRAY<VARCHAR>, \
             home STRUCT<city VARCHAR, zip INT>>', 'Facts of {0}', body) FROM t"
        );
        let plain = normalized("SELECT AI.GENERATE(('Facts of ', body)) FROM t").unwrap();
        assert_eq!(plain, "SELECT ai_complete('Facts of {0}', body) FROM t");
        // Field access as BigQuery writes it: .result of a text answer, a
        // struct's field by name.
        let result = normalized("SELECT AI.GENERATE(('Facts of ', body)).result FROM t").unwrap();
        assert_eq!(result, plain);
        let age = normalized(
            "SELECT AI.GENERATE(('Facts of ', body), output_schema => 'age INT64').age FROM t",
        )
        .unwrap();
        assert_eq!(
            age,
            "SELECT ai_generate('STRUCT<age INT>', 'Facts of {0}', body)['age'] FROM t"
        );
        let year = normalized("SELECT AI.GENERATE_INT(('Year of ', body)).result FROM t").unwrap();
        assert_eq!(
            year,
            "SELECT ai_generate('INT', 'Year of {0}', body) FROM t"
        );
        let e = normalized("SELECT AI.GENERATE(('Facts of ', body)).status FROM t").unwrap_err();
        assert!(e.to_string().contains(".result only"), "{e}");
        let refused = |schema: &str, says: &str| {
            let e = normalized(&format!(
                "SELECT AI.GENERATE(('Facts of ', body), output_schema => {schema}) FROM t"
            ))
            .unwrap_err()
            .to_string();
            assert!(
                e.contains(says) && e.contains("line 1") && e.contains("output_schema"),
                "{schema}: {e}"
            );
        };
        refused("'name'", "has no type");
        refused("'name BLOB'", "\"BLOB\" is not a type");
        refused("'a INT64, a STRING'", "comes twice");
        refused("'a JSON {}'", "JSON inside a STRUCT");
        refused("'a ARRAY<INT64'", "unclosed");
        refused("''", "has no type");
        refused("body", "as a string literal");
    }

    #[test]
    fn snowflake_response_formats_become_json_types() {
        let schema = "{'type': 'object', 'properties': {'year': {'type': 'integer', \
                      'minimum': -5}, 'kind': {'enum': ['film', 'food']}}, 'required': ['year'], \
                      'additionalProperties': false}";
        let object = normalized(&format!(
            "SELECT AI_COMPLETE('qwen3', PROMPT('Facts of {{0}}', body), \
             response_format => {{'type': 'json', 'schema': {schema}}}) FROM t"
        ))
        .unwrap();
        assert!(
            object.contains("ai_generate('JSON {")
                && object.contains("\"minimum\":-5")
                && object.contains("\"required\":[\"year\"]")
                && object.contains("\"additionalProperties\":false")
                && object.ends_with("'Facts of {0}', body) FROM t"),
            "{object}"
        );
        // The same format as a string of JSON, and on aisql's own spelling.
        let text = normalized(
            "SELECT ai_complete('Facts of {0}', body, response_format => '{\"type\": \"json\", \
             \"schema\": {\"type\": \"object\", \"properties\": {\"year\": {\"type\": \
             \"integer\", \"minimum\": -5}, \"kind\": {\"enum\": [\"film\", \"food\"]}}, \
             \"required\": [\"year\"], \"additionalProperties\": false}}') FROM t",
        )
        .unwrap();
        assert_eq!(object, text);
        let refused = |format: &str, says: &str| {
            let e = normalized(&format!(
                "SELECT ai_complete('Facts of {{0}}', body, response_format => {format}) FROM t"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains(says) && e.contains("line 1"), "{format}: {e}");
        };
        refused("{'type': 'xml', 'schema': {}}", "needs 'type': 'json'");
        refused("{'type': 'json'}", "needs a 'schema'");
        refused(
            "{'type': 'json', 'schema': {}, 'strict': true}",
            "unknown key 'strict'",
        );
        refused("'{not json'", "a string that is not JSON");
        refused(
            "{'type': 'json', 'schema': {'maximum': body}}",
            "body is not a constant",
        );
        let both = normalized(
            "SELECT ai_complete('Facts of {0}', body, returns => 'INT', \
             response_format => {'type': 'json', 'schema': {}}) FROM t",
        )
        .unwrap_err();
        assert!(
            both.to_string().contains("give the answer's type once"),
            "{both}"
        );
        let computed = normalized(
            "SELECT ai_complete('Facts of {0}', body, returns => concat('I', 'NT')) FROM t",
        )
        .unwrap_err();
        assert!(
            computed.to_string().contains("as a string literal"),
            "{computed}"
        );
    }

    #[test]
    fn deep_nesting_is_refused() {
        let terms: Vec<String> = (0..1500).map(|i| format!("x = {i}")).collect();
        let e = normalized(&format!("SELECT 1 FROM t WHERE {}", terms.join(" OR "))).unwrap_err();
        assert!(e.to_string().contains("levels deep"), "{e}");
        let terms: Vec<String> = (0..500).map(|i| format!("x = {i}")).collect();
        normalized(&format!("SELECT 1 FROM t WHERE {}", terms.join(" OR "))).unwrap();
    }

    #[test]
    fn deep_subqueries_in_expressions_are_refused() {
        let nest = |n: usize| format!("SELECT {}1{}", "(SELECT ".repeat(n), ")".repeat(n));
        let e = normalized(&nest(MAX_SUBQUERY_NESTING + 1)).unwrap_err();
        assert!(e.to_string().contains("subqueries in expressions"), "{e}");
        normalized(&nest(MAX_SUBQUERY_NESTING)).unwrap();
        let exists = format!(
            "SELECT 1 FROM t WHERE {}true{}",
            "EXISTS (SELECT 1 FROM t WHERE ".repeat(MAX_SUBQUERY_NESTING + 1),
            ")".repeat(MAX_SUBQUERY_NESTING + 1)
        );
        assert!(normalized(&exists).is_err());
        // Subqueries in FROM are not counted.
        let derived = format!(
            "SELECT * FROM {}t{}",
            "(SELECT * FROM ".repeat(30),
            ") x".repeat(30)
        );
        normalized(&derived).unwrap();
    }

    #[test]
    fn errors_give_positions() {
        let e =
            normalized("SELECT id FROM t\nWHERE ai_filter('no placeholder', body)").unwrap_err();
        assert!(e.to_string().contains("line 2, column 7"), "{e}");
        let e = normalized("SELECT id FROM t WHERE ai_join('{0} {1}', a)").unwrap_err();
        assert!(e.to_string().contains("ai_join takes"), "{e}");
        let e = normalized("SELECT id FROM t WHERE AI.GUESS(body)").unwrap_err();
        assert!(e.to_string().contains("unknown AI function"), "{e}");
        let e = normalized("SELECT id FROM t WHERE ai_filtr('{0}', body)").unwrap_err();
        assert!(
            e.to_string().contains("unknown AI function ai_filtr"),
            "{e}"
        );
    }
}
