//! The analyzer rule that turns AI function calls into AI operators
//! ([`AiNode`]), wherever the calls came from (SQL in any spelling, any
//! Substrait producer), and the optimizer rule that keeps ordinary predicates
//! ahead of them.
//!
//! [`AiRewrite`] walks the plan bottom-up:
//! - a `Filter`'s conjuncts are split: ordinary ones stay in a filter below,
//!   each bare AI predicate becomes an [`AiShape::Filter`] operator (cheapest
//!   prompt first), and AI calls inside `OR`/`NOT`/`CASE` become
//!   [`AiShape::Project`] operators whose value the remaining filter reads;
//! - a filter over an inner join whose AI predicate reads one document from each
//!   side becomes an [`AiShape::Join`], with the join's equalities;
//! - a join whose `ON` holds an AI call becomes an AI join of the same type
//!   (inner, outer, semi, anti);
//! - any other operator (projection, aggregate, sort, window) gets its AI calls
//!   computed by [`AiShape::Project`] operators below it.
//!
//! A document argument that is not a plain column is computed by a projection
//! below the operator. Operator ids number each question kind in post-order
//! (`filter-1`, `join-1`, `classify-1`), as QUAIL-B numbers its plans.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{Column, DFSchema, JoinType};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::functions_aggregate::expr_fn::array_agg;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{
    Aggregate, BinaryExpr, Expr, Extension, Filter, Join, LogicalPlan, LogicalPlanBuilder,
    Operator, Projection,
};
use datafusion::optimizer::analyzer::AnalyzerRule;
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

use crate::exec::ai_aggregate::{ai_agg_of, round_pieces};
use crate::exec::ai_functions::{
    AiArgs, AiFunction, ai_call_of, contains_ai_call, embedding_dims_of,
};
use crate::exec::logical::{AiNode, AiShape, AiSpec, DocRef, check_text};
use crate::inference::prompt::PromptFormat;

use super::spelling::CallSites;

/// What the rewrite needs to know about the session.
#[derive(Debug, Default)]
pub struct RewriteContext {
    /// Tables whose `id` column is unique (QUAIL-B datasets): their documents
    /// are keyed by id. Elsewhere a document is keyed by its text, so two rows
    /// with one text share an answer and never two texts one.
    pub unique_id_tables: HashSet<String>,
    /// Where the current statement's AI calls are, by template.
    pub sites: CallSites,
    /// Expected fraction of rows an AI filter keeps, by template (a user's
    /// hint): orders the AI filters of one relation.
    pub selectivity: HashMap<String, f64>,
}

/// Selectivity assumed for an AI filter without a hint.
const DEFAULT_SELECTIVITY: f64 = 0.5;

/// The analyzer rule.
#[derive(Debug)]
pub struct AiRewrite {
    format: PromptFormat,
    context: Arc<Mutex<RewriteContext>>,
}

impl AiRewrite {
    /// A rule rendering prompts in `format`, reading `context` on each run.
    pub fn new(format: PromptFormat, context: Arc<Mutex<RewriteContext>>) -> Self {
        Self { format, context }
    }
}

impl AnalyzerRule for AiRewrite {
    fn name(&self) -> &str {
        "ai_rewrite"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DfResult<LogicalPlan> {
        let context = self.context.lock().expect("rewrite context lock");
        let mut r = Rewriter {
            format: self.format,
            context: &context,
            counters: HashMap::new(),
            columns: 0,
        };
        plan.transform_up_with_subqueries(|p| r.rewrite(p)).data()
    }
}

struct Rewriter<'a> {
    format: PromptFormat,
    context: &'a RewriteContext,
    /// Operators numbered so far, by id prefix.
    counters: HashMap<&'static str, usize>,
    /// Columns added so far (`__ai_1`, ...).
    columns: usize,
}

/// An AI call's documents as columns of its (possibly extended) input.
struct Documents {
    input: LogicalPlan,
    docs: Vec<DocRef>,
    tables: Vec<String>,
    columns: Vec<String>,
}

/// One AI call, checked, with its place in the SQL for errors.
struct Call {
    args: AiArgs,
    text: String,
}

fn plan_error(message: String) -> DataFusionError {
    DataFusionError::Plan(message)
}

fn is_bool_call(e: &Expr) -> bool {
    ai_call_of(e).is_some_and(|(f, _)| f.kind.is_decision())
}

impl Rewriter<'_> {
    fn rewrite(&mut self, plan: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
        if let LogicalPlan::Join(j) = &plan
            && let Some(e) = j
                .filter
                .iter()
                .chain(j.on.iter().flat_map(|(a, b)| [a, b]))
                .find(|e| contains_ai_aggregate(e))
        {
            return Err(plan_error(format!(
                "{}: an AI aggregate in a join condition is not supported (an aggregate \
                 cannot decide which pairs join); aggregate in a subquery and join its result",
                describe_with(self.context, e, None)
            )));
        }
        match plan {
            LogicalPlan::Filter(f) if contains_ai_call(&f.predicate) => self
                .filter(Arc::unwrap_or_clone(f.input), f.predicate)
                .map(Transformed::yes),
            LogicalPlan::Join(j) if j.filter.as_ref().is_some_and(contains_ai_call) => {
                self.join(j).map(Transformed::yes)
            }
            LogicalPlan::Aggregate(a) if a.aggr_expr.iter().any(contains_ai_aggregate) => {
                let plan = self.ai_aggregate(a)?;
                // Scalar AI calls in the other aggregates' arguments.
                match plan {
                    p if p.expressions().iter().any(contains_ai_call) => {
                        self.other(p).map(Transformed::yes)
                    }
                    p => Ok(Transformed::yes(p)),
                }
            }
            plan if plan.expressions().iter().any(contains_ai_call) => {
                self.other(plan).map(Transformed::yes)
            }
            plan => Ok(Transformed::no(plan)),
        }
    }

    /// Where a call is, for errors: its text and, from SQL, line and column.
    fn describe(&self, e: &Expr, args: Option<&AiArgs>) -> String {
        describe_with(self.context, e, args)
    }

    fn parse(&self, e: &Expr) -> DfResult<Call> {
        let (function, args) = ai_call_of(e).expect("an AI call");
        let parsed = AiArgs::parse(function, args)
            .and_then(|mut a| a.resolve_dims(embedding_dims_of(e)).map(|()| a))
            .map_err(|m| plan_error(format!("{}: {m}", self.describe(e, None))))?;
        let text = self.describe(e, Some(&parsed));
        if let Some(inner) = args.iter().find(|a| contains_ai_call(a)) {
            return Err(plan_error(format!(
                "{text}: an AI call inside another AI call's argument ({inner}) is not supported; \
                 compute it in a subquery first"
            )));
        }
        if let Some(outer) = args.iter().find(|a| has_outer_reference(a)) {
            return Err(plan_error(format!(
                "{text}: an AI call in a correlated subquery may not read the outer query's \
                 columns ({outer}); write it as a join"
            )));
        }
        Ok(Call { args: parsed, text })
    }

    /// Expected cost of a filter per row it is asked: its fixed prompt bytes
    /// over the fraction of rows it drops (infinite for one that drops none).
    fn rank(&self, call: &Call) -> f64 {
        let bytes = call
            .args
            .call("", self.format, vec![], vec![])
            .map_or(usize::MAX, |c| c.pieces.fixed_len()) as f64;
        let keeps = self
            .context
            .selectivity
            .get(&call.args.template)
            .copied()
            .unwrap_or(DEFAULT_SELECTIVITY);
        bytes / (1.0 - keeps)
    }

    fn next_id(&mut self, prefix: &'static str) -> String {
        let n = self.counters.entry(prefix).or_insert(0);
        *n += 1;
        format!("{prefix}-{n}")
    }

    fn fresh_column(&mut self) -> Column {
        self.columns += 1;
        Column::new_unqualified(format!("__ai_{}", self.columns))
    }

    /// The documents of `call` as columns of `input`, computing any that are not
    /// plain columns in a projection added below.
    fn documents(&mut self, call: &Call, input: LogicalPlan) -> DfResult<Documents> {
        let mut input = input;
        let mut docs = Vec::new();
        let mut tables = Vec::new();
        let mut columns = Vec::new();
        for (i, e) in call.args.documents.iter().enumerate() {
            let column = match e {
                Expr::Column(c) => c.clone(),
                other => {
                    let c = self.fresh_column();
                    input = project_extra(input, vec![other.clone().alias(c.name.clone())])?;
                    c
                }
            };
            let (_, field) = input
                .schema()
                .qualified_field_from_column(&column)
                .map_err(|_| plan_error(format!("{}: no column {column} here", call.text)))?;
            check_text(e, field.data_type())
                .map_err(|m| plan_error(format!("{}: {{{i}}}: {m}", call.text)))?;
            let source = source_of(&input, &column);
            let (table, source_column) = source.clone().unwrap_or_else(|| {
                (
                    column
                        .relation
                        .as_ref()
                        .map_or("expr".into(), |r| r.to_string()),
                    column.name.clone(),
                )
            });
            let id = column
                .relation
                .as_ref()
                .map(|r| Column::new(Some(r.clone()), "id"))
                .filter(|id| {
                    self.context.unique_id_tables.contains(&table)
                        && input.schema().has_column(id)
                        && source_of(&input, id).is_some_and(|(t, _)| t == table)
                })
                .unwrap_or_else(|| column.clone());
            docs.push(DocRef {
                alias: column
                    .relation
                    .as_ref()
                    .map_or_else(|| table.clone(), |r| r.table().to_string()),
                id,
                text: column,
            });
            tables.push(table);
            columns.push(source_column);
        }
        Ok(Documents {
            input,
            docs,
            tables,
            columns,
        })
    }

    fn spec(
        &mut self,
        call: &Call,
        shape: AiShape,
        docs: Vec<DocRef>,
        tables: Vec<String>,
        columns: Vec<String>,
    ) -> DfResult<AiSpec> {
        let op_id = self.next_id(if call.args.function.aggregate {
            "agg"
        } else {
            call.args.kind().name()
        });
        let mut ai_call = call
            .args
            .call(&op_id, self.format, tables, columns)
            .map_err(|e| plan_error(format!("{}: {e}", call.text)))?;
        ai_call.relations = docs.iter().map(|d| d.alias.clone()).collect();
        Ok(AiSpec {
            call: ai_call,
            shape,
            docs,
            equalities: Vec::new(),
            output: None,
            residual: None,
            combine: None,
        })
    }

    /// `Filter(predicate)` over `input`.
    fn filter(&mut self, input: LogicalPlan, predicate: Expr) -> DfResult<LogicalPlan> {
        let original = input.schema().clone();
        let mut cheap = Vec::new();
        let mut direct = Vec::new();
        let mut complex = Vec::new();
        let mut correlated = Vec::new();
        for c in split_conjunction_owned(predicate) {
            if has_outer_reference(&c) && !contains_ai_call(&c) {
                // The subquery's link to the outer query stays on top, where
                // decorrelation lifts it into a join.
                correlated.push(c);
            } else if !contains_ai_call(&c) {
                cheap.push(c);
            } else if is_bool_call(&c) {
                direct.push(c);
            } else {
                complex.push(c);
            }
        }
        let mut input = input;
        // A pair predicate over an inner join without an AI condition joins its sides.
        if let LogicalPlan::Join(j) = &input
            && j.join_type == JoinType::Inner
            && j.filter.as_ref().is_none_or(|f| !contains_ai_call(f))
            && let Some(pos) = direct.iter().position(|c| crosses(c, j))
        {
            let c = direct.remove(pos);
            let LogicalPlan::Join(j) = input else {
                unreachable!()
            };
            input = self.ai_join_from_filter(j, c, &mut cheap)?;
        }
        if let Some(p) = conjunction(cheap) {
            input = LogicalPlanBuilder::from(input).filter(p)?.build()?;
        }
        // Filters that are cheap and drop many rows run first: the order of
        // least expected cost, fixed prompt bytes / (1 - selectivity).
        let mut calls = direct
            .iter()
            .map(|e| {
                let call = self.parse(e)?;
                let rank = self.rank(&call);
                Ok((rank, call))
            })
            .collect::<DfResult<Vec<_>>>()?;
        calls.sort_by(|a, b| a.0.total_cmp(&b.0));
        let calls = calls.into_iter().map(|(_, call)| call);
        for call in calls {
            let d = self.documents(&call, input.clone())?;
            let spec = self.spec(&call, AiShape::Filter, d.docs, d.tables, d.columns)?;
            input = restore_columns(ai_plan(spec, vec![d.input])?, input.schema())?;
        }
        if !complex.is_empty() {
            let schema = input.schema().clone();
            let (with_values, exprs) = self.values(input, complex)?;
            let p = conjunction(exprs).expect("non-empty");
            let filtered = LogicalPlanBuilder::from(with_values).filter(p)?.build()?;
            input = restore_columns(filtered, &schema)?;
        }
        // Computed document columns are the operators' business only.
        let input = restore_columns(input, &original)?;
        match conjunction(correlated) {
            Some(p) => LogicalPlanBuilder::from(input).filter(p)?.build(),
            None => Ok(input),
        }
    }

    /// An inner join's pair predicate `call` becomes an AI join; equalities
    /// among `cheap` become its keys, one-sided conditions go to their side.
    fn ai_join_from_filter(
        &mut self,
        join: Join,
        call: Expr,
        cheap: &mut Vec<Expr>,
    ) -> DfResult<LogicalPlan> {
        let mut on = join.on.clone();
        let mut rest = Vec::new();
        let mut residual = Vec::new();
        for c in std::mem::take(cheap).into_iter().chain(join.filter.clone()) {
            if let Some(pair) = equality(&c, &join) {
                on.push(pair);
            } else if refers_only_to(&c, join.left.schema())
                || refers_only_to(&c, join.right.schema())
                || c.column_refs().is_empty()
            {
                rest.push(c); // one side: filtered before the join
            } else {
                residual.push(c); // both sides: checked before a pair is asked
            }
        }
        let ai = self.ai_join(
            join.left,
            join.right,
            JoinType::Inner,
            on,
            conjunction(residual),
            &call,
        )?;
        *cheap = rest;
        Ok(ai)
    }

    /// An AI join of `left` and `right` on `call`, with key equalities `on`.
    fn ai_join(
        &mut self,
        left: Arc<LogicalPlan>,
        right: Arc<LogicalPlan>,
        join_type: JoinType,
        on: Vec<(Expr, Expr)>,
        residual: Option<Expr>,
        e: &Expr,
    ) -> DfResult<LogicalPlan> {
        let call = self.parse(e)?;
        if call.args.documents.len() != 2 {
            return Err(plan_error(format!(
                "{}: a join condition's AI call needs one document from each side",
                call.text
            )));
        }
        let left_first = refers_only_to(&call.args.documents[0], left.schema());
        let (anchor, partner) = if left_first {
            (Arc::unwrap_or_clone(left), Arc::unwrap_or_clone(right))
        } else {
            (Arc::unwrap_or_clone(right), Arc::unwrap_or_clone(left))
        };
        let one = |e: &Expr| Call {
            args: AiArgs {
                documents: vec![e.clone()],
                ..call.args.clone()
            },
            text: call.text.clone(),
        };
        let a = self.documents(&one(&call.args.documents[0]), anchor)?;
        let p = self.documents(&one(&call.args.documents[1]), partner)?;
        let (anchor, partner) = (a.input, p.input);
        let docs = [a.docs, p.docs].concat();
        let tables = [a.tables, p.tables].concat();
        let columns = [a.columns, p.columns].concat();
        let key = |e: Expr| match e {
            Expr::Column(c) => Ok(c),
            other => Err(plan_error(format!(
                "{}: the join key {other} must be a column",
                call.text
            ))),
        };
        let mut equalities = Vec::new();
        for (l, r) in on {
            let (l, r) = (key(l)?, key(r)?);
            equalities.push(if left_first { (l, r) } else { (r, l) });
        }
        let mut spec = self.spec(&call, AiShape::Join(join_type), docs, tables, columns)?;
        spec.equalities = equalities;
        spec.residual = residual;
        let (l, r) = if left_first {
            (anchor, partner)
        } else {
            (partner, anchor)
        };
        ai_plan(spec, vec![l, r])
    }

    /// A join whose `ON` holds an AI call.
    fn join(&mut self, j: Join) -> DfResult<LogicalPlan> {
        let filter = j.filter.clone().expect("an AI condition");
        if j.join_type == JoinType::Inner {
            // Same as a WHERE over the join without its AI conditions.
            let (ai, plain): (Vec<Expr>, Vec<Expr>) = split_conjunction_owned(filter)
                .into_iter()
                .partition(contains_ai_call);
            let join = Join {
                filter: conjunction(plain),
                ..j
            };
            let predicate = conjunction(ai).expect("an AI conjunct");
            return self.filter(LogicalPlan::Join(join), predicate);
        }
        let t = j.join_type;
        // Conditions on the side the join does not preserve may filter that side
        // first; conditions on a preserved side have no meaning in `ON` here.
        if j.null_aware {
            // The decorrelation spells NOT IN out as an ordinary anti join.
            return Err(plan_error(format!(
                "a null-aware anti join (NOT IN) with an AI condition is not supported: {}; \
                 write it as NOT EXISTS",
                crate::inference::prompt::shorten(&filter.to_string(), 96)
            )));
        }
        let (filters_left, filters_right) = match t {
            JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => {
                (false, true)
            }
            JoinType::Right | JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => {
                (true, false)
            }
            _ => (false, false),
        };
        let mut left = Arc::unwrap_or_clone(j.left.clone());
        let mut right = Arc::unwrap_or_clone(j.right.clone());
        let mut on = j.on.clone();
        let mut pair = None;
        let mut residual = Vec::new();
        for c in split_conjunction_owned(filter) {
            let on_left = refers_only_to(&c, left.schema());
            let on_right = refers_only_to(&c, right.schema());
            if on_right && filters_right {
                right = self.filter(right, c)?;
            } else if on_left && filters_left {
                left = self.filter(left, c)?;
            } else if let Some(eq) = equality(&c, &j) {
                on.push(eq);
            } else if is_bool_call(&c) && !on_left && !on_right && pair.is_none() {
                pair = Some(c);
            } else if !contains_ai_call(&c) {
                // Part of the ON condition, checked per pair before it is asked.
                residual.push(c);
            } else {
                let what = if contains_ai_call(&c) {
                    self.describe(
                        &c,
                        ai_call_of(&c)
                            .and_then(|(f, a)| AiArgs::parse(f, a).ok())
                            .as_ref(),
                    )
                } else {
                    c.to_string()
                };
                return Err(plan_error(format!(
                    "{what}: in the ON of a {t} JOIN an AI call must read one document from \
                     each side (one per join), or only the side the join does not preserve; \
                     this one does neither"
                )));
            }
        }
        let Some(pair) = pair else {
            // Every AI condition filtered a side: an ordinary join remains.
            let keys: (Vec<Expr>, Vec<Expr>) = on.into_iter().unzip();
            return LogicalPlanBuilder::from(left)
                .join_with_expr_keys(right, t, keys, conjunction(residual))?
                .build();
        };
        let joined = self.ai_join(
            Arc::new(left),
            Arc::new(right),
            t,
            on,
            conjunction(residual),
            &pair,
        )?;
        restore_columns(joined, &j.schema)
    }

    /// AI calls inside `exprs` computed below as columns of `input`; returns the
    /// new input and the expressions reading those columns.
    fn values(
        &mut self,
        input: LogicalPlan,
        exprs: Vec<Expr>,
    ) -> DfResult<(LogicalPlan, Vec<Expr>)> {
        let mut input = input;
        let mut done: HashMap<Expr, Column> = HashMap::new();
        let mut out = Vec::with_capacity(exprs.len());
        for e in exprs {
            let mut failure = None;
            let rewritten = e
                .transform_down(|x| {
                    if ai_call_of(&x).is_none() || failure.is_some() {
                        return Ok(Transformed::no(x));
                    }
                    if let Some(c) = done.get(&x) {
                        return Ok(Transformed::new(
                            Expr::Column(c.clone()),
                            true,
                            datafusion::common::tree_node::TreeNodeRecursion::Jump,
                        ));
                    }
                    match self.value(&x, input.clone()) {
                        Ok((plan, column)) => {
                            input = plan;
                            done.insert(x, column.clone());
                            Ok(Transformed::new(
                                Expr::Column(column),
                                true,
                                datafusion::common::tree_node::TreeNodeRecursion::Jump,
                            ))
                        }
                        Err(err) => {
                            failure = Some(err);
                            Ok(Transformed::no(x))
                        }
                    }
                })?
                .data;
            if let Some(err) = failure {
                return Err(err);
            }
            out.push(rewritten);
        }
        Ok((input, out))
    }

    /// One AI call as a column appended to `input`.
    fn value(&mut self, e: &Expr, input: LogicalPlan) -> DfResult<(LogicalPlan, Column)> {
        let call = self.parse(e)?;
        let schema = input.schema().clone();
        let d = self.documents(&call, input)?;
        let output = self.fresh_column();
        let mut spec = self.spec(&call, AiShape::Project, d.docs, d.tables, d.columns)?;
        spec.output = Some(output.clone());
        let node = ai_plan(spec, vec![d.input])?;
        // Keep the input's columns and the value, not computed documents.
        let mut keep: Vec<Expr> = schema.columns().into_iter().map(Expr::Column).collect();
        keep.push(Expr::Column(output.clone()));
        let plan = if node.schema().fields().len() == keep.len() {
            node
        } else {
            LogicalPlan::Projection(Projection::try_new(keep, Arc::new(node))?)
        };
        Ok((plan, output))
    }

    /// An aggregate with `ai_agg` calls: each becomes `array_agg` of its
    /// column, and an [`AiShape::Aggregate`] operator above reduces each
    /// group's list; a projection gives the columns their original names.
    fn ai_aggregate(&mut self, a: Aggregate) -> DfResult<LogicalPlan> {
        let original = a.schema.clone();
        let groups = a.group_expr.len();
        let ai_agg = AiFunction::from_name("ai_agg").expect("ai_agg is registered");
        let mut input = Arc::unwrap_or_clone(a.input);
        let mut aggregates = Vec::with_capacity(a.aggr_expr.len());
        // Per aggregate replaced: (its index, the call, its documents, its list column).
        let mut replaced = Vec::new();
        for (i, e) in a.aggr_expr.iter().enumerate() {
            let inner = match e {
                Expr::Alias(alias) => alias.expr.as_ref(),
                e => e,
            };
            let Some(f) = ai_agg_of(inner) else {
                aggregates.push(e.clone());
                continue;
            };
            let text = describe_with(self.context, inner, None);
            let p = &f.params;
            if p.distinct || p.filter.is_some() || !p.order_by.is_empty() {
                return Err(plan_error(format!(
                    "{text}: DISTINCT, FILTER and ORDER BY are not supported in ai_agg"
                )));
            }
            let args =
                AiArgs::parse(ai_agg, &p.args).map_err(|m| plan_error(format!("{text}: {m}")))?;
            if let Some(inner) = p.args.iter().find(|a| contains_ai_call(a)) {
                return Err(plan_error(format!(
                    "{text}: an AI call inside ai_agg's argument ({inner}) is not supported; \
                     compute it in a subquery first"
                )));
            }
            let call = Call { args, text };
            let d = self.documents(&call, input)?;
            input = d.input;
            let list = self.fresh_column();
            aggregates
                .push(array_agg(Expr::Column(d.docs[0].text.clone())).alias(list.name.clone()));
            replaced.push((i, call, d.docs, d.tables, d.columns, list));
        }
        let mut plan = LogicalPlan::Aggregate(Aggregate::try_new(
            Arc::new(input),
            a.group_expr,
            aggregates,
        )?);
        let mut outputs = HashMap::new();
        for (i, call, mut docs, tables, columns, list) in replaced {
            docs[0].id = list.clone();
            docs[0].text = list;
            let mut spec = self.spec(&call, AiShape::Aggregate, docs, tables, columns)?;
            spec.combine = Some(round_pieces(self.format, &call.args.template, true));
            let output = self.fresh_column();
            spec.output = Some(output.clone());
            plan = ai_plan(spec, vec![plan])?;
            outputs.insert(groups + i, output);
        }
        let exprs: Vec<Expr> = original
            .iter()
            .enumerate()
            .map(|(i, (qualifier, field))| match outputs.get(&i) {
                Some(out) => Expr::Column(out.clone())
                    .alias_qualified(qualifier.cloned(), field.name().clone()),
                None => Expr::Column(Column::new(qualifier.cloned(), field.name())),
            })
            .collect();
        Ok(LogicalPlan::Projection(Projection::try_new(
            exprs,
            Arc::new(plan),
        )?))
    }

    /// Any other operator with AI calls in its expressions.
    fn other(&mut self, plan: LogicalPlan) -> DfResult<LogicalPlan> {
        let inputs = plan.inputs();
        if inputs.len() != 1 {
            let e = plan.expressions().into_iter().find(contains_ai_call);
            return Err(plan_error(format!(
                "an AI call in a {} is not supported{}",
                plan.display(),
                e.map(|e| format!(": {e}")).unwrap_or_default()
            )));
        }
        let input = inputs[0].clone();
        let preserver = NamePreserver::new(&plan);
        let exprs = plan.expressions();
        let names: Vec<_> = exprs.iter().map(|e| preserver.save(e)).collect();
        let (new_input, new_exprs) = self.values(input, exprs)?;
        let new_exprs = if matches!(plan, LogicalPlan::Sort(_)) {
            new_exprs
        } else {
            new_exprs
                .into_iter()
                .zip(names)
                .map(|(e, n)| n.restore(e))
                .collect()
        };
        let rebuilt = plan.with_new_exprs(new_exprs, vec![new_input])?;
        restore_columns(rebuilt, plan.schema())
    }
}

/// Whether `e` calls `ai_agg` anywhere.
fn contains_ai_aggregate(e: &Expr) -> bool {
    e.exists(|x| Ok(ai_agg_of(x).is_some())).unwrap_or(false)
}

fn ai_plan(spec: AiSpec, inputs: Vec<LogicalPlan>) -> DfResult<LogicalPlan> {
    Ok(LogicalPlan::Extension(Extension {
        node: Arc::new(AiNode::try_new(spec, inputs)?),
    }))
}

/// `input` with `extra` expressions appended as columns.
fn project_extra(input: LogicalPlan, extra: Vec<Expr>) -> DfResult<LogicalPlan> {
    let mut exprs: Vec<Expr> = input
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    exprs.extend(extra);
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(input),
    )?))
}

/// `plan` cut back to the columns of `schema` when it has gained some.
fn restore_columns(plan: LogicalPlan, schema: &DFSchema) -> DfResult<LogicalPlan> {
    if plan.schema().fields().len() == schema.fields().len() {
        return Ok(plan);
    }
    let exprs: Vec<Expr> = schema.columns().into_iter().map(Expr::Column).collect();
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(plan),
    )?))
}

fn describe_with(context: &RewriteContext, e: &Expr, args: Option<&AiArgs>) -> String {
    let place = args
        .and_then(|a| context.sites.get(&a.template))
        .cloned()
        .unwrap_or_default();
    format!(
        "{}{place}",
        crate::inference::prompt::shorten(&e.to_string(), 96)
    )
}

/// An AI call for errors: its text and, from SQL, its line and column.
pub(super) fn describe_call(context: &RewriteContext, e: &Expr) -> String {
    let args = ai_call_of(e).and_then(|(f, a)| AiArgs::parse(f, a).ok());
    describe_with(context, e, args.as_ref())
}

pub(super) fn has_outer_reference(e: &Expr) -> bool {
    e.exists(|e| Ok(matches!(e, Expr::OuterReferenceColumn(..))))
        .unwrap_or(false)
}

/// Whether every column `e` reads is in `schema` (and it reads at least one).
fn refers_only_to(e: &Expr, schema: &DFSchema) -> bool {
    let refs = e.column_refs();
    !refs.is_empty() && refs.iter().all(|c| schema.has_column(c))
}

/// Whether a pair AI call reads one document from each side of `join`.
fn crosses(e: &Expr, join: &Join) -> bool {
    let Some((function, args)) = ai_call_of(e) else {
        return false;
    };
    let Ok(parsed) = AiArgs::parse(function, args) else {
        return false;
    };
    if parsed.documents.len() != 2 {
        return false;
    }
    let (l, r) = (join.left.schema(), join.right.schema());
    let (d0, d1) = (&parsed.documents[0], &parsed.documents[1]);
    (refers_only_to(d0, l) && refers_only_to(d1, r))
        || (refers_only_to(d0, r) && refers_only_to(d1, l))
}

/// `left.col = right.col` (either way round) as a key pair of `join`.
fn equality(e: &Expr, join: &Join) -> Option<(Expr, Expr)> {
    let Expr::BinaryExpr(BinaryExpr {
        left,
        op: Operator::Eq,
        right,
    }) = e
    else {
        return None;
    };
    let (l, r) = (join.left.schema(), join.right.schema());
    match (left.as_ref(), right.as_ref()) {
        (Expr::Column(a), Expr::Column(b)) if l.has_column(a) && r.has_column(b) => {
            Some((Expr::Column(a.clone()), Expr::Column(b.clone())))
        }
        (Expr::Column(a), Expr::Column(b)) if r.has_column(a) && l.has_column(b) => {
            Some((Expr::Column(b.clone()), Expr::Column(a.clone())))
        }
        _ => None,
    }
}

/// The table and column a column of `plan` is read from, through aliases,
/// projections of plain columns, filters, joins and AI operators.
pub fn source_of(plan: &LogicalPlan, column: &Column) -> Option<(String, String)> {
    let index = plan.schema().index_of_column(column).ok()?;
    match plan {
        LogicalPlan::TableScan(s) => Some((
            s.table_name.table().to_string(),
            s.projected_schema.field(index).name().clone(),
        )),
        LogicalPlan::Projection(p) => match p.expr.get(index)? {
            Expr::Column(c) => source_of(&p.input, c),
            Expr::Alias(a) => match a.expr.as_ref() {
                Expr::Column(c) => source_of(&p.input, c),
                _ => None,
            },
            _ => None,
        },
        LogicalPlan::Join(_) | LogicalPlan::Extension(_) | LogicalPlan::SubqueryAlias(_) => {
            // Inputs' columns in order, left then right.
            let mut offset = 0;
            for input in plan.inputs() {
                let width = input.schema().fields().len();
                if index < offset + width {
                    let (q, f) = input.schema().qualified_field(index - offset);
                    return source_of(input, &Column::new(q.cloned(), f.name()));
                }
                offset += width;
            }
            None
        }
        other => {
            let inputs = other.inputs();
            let [input] = inputs.as_slice() else {
                return None;
            };
            if input.schema().fields().len() <= index {
                return None;
            }
            let (q, f) = input.schema().qualified_field(index);
            source_of(input, &Column::new(q.cloned(), f.name()))
        }
    }
}

/// The optimizer rule that moves ordinary predicates above an AI join into the
/// join's inputs (DataFusion pushes a predicate into every input of a
/// two-input extension node, which a join cannot allow): rows a cheap predicate
/// drops never reach the model.
#[derive(Debug, Default)]
pub struct AiJoinPredicatePushdown;

impl OptimizerRule for AiJoinPredicatePushdown {
    fn name(&self) -> &str {
        "ai_join_predicate_pushdown"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        let plan = match plan {
            LogicalPlan::Extension(e) => return ai_filter_below_ai_join(e),
            other => other,
        };
        let LogicalPlan::Filter(filter) = plan else {
            return Ok(Transformed::no(plan));
        };
        let LogicalPlan::Extension(ext) = filter.input.as_ref() else {
            return Ok(Transformed::no(LogicalPlan::Filter(filter)));
        };
        let Some(node) = ext.node.as_any().downcast_ref::<AiNode>() else {
            return Ok(Transformed::no(LogicalPlan::Filter(filter)));
        };
        let AiShape::Join(t) = node.spec.shape else {
            return Ok(Transformed::no(LogicalPlan::Filter(filter)));
        };
        let (left_ok, right_ok) = movable_sides(t);
        let (l, r) = (&node.inputs[0], &node.inputs[1]);
        let mut left_preds = Vec::new();
        let mut right_preds = Vec::new();
        let mut keep = Vec::new();
        for c in split_conjunction_owned(filter.predicate.clone()) {
            let volatile = c.is_volatile();
            if !volatile && left_ok && refers_only_to(&c, l.schema()) {
                left_preds.push(c);
            } else if !volatile && right_ok && refers_only_to(&c, r.schema()) {
                right_preds.push(c);
            } else {
                keep.push(c);
            }
        }
        if left_preds.is_empty() && right_preds.is_empty() {
            return Ok(Transformed::no(LogicalPlan::Filter(filter)));
        }
        let wrap = |input: &LogicalPlan, preds: Vec<Expr>| -> DfResult<LogicalPlan> {
            Ok(match conjunction(preds) {
                Some(p) => LogicalPlan::Filter(Filter::try_new(p, Arc::new(input.clone()))?),
                None => input.clone(),
            })
        };
        let inputs = vec![wrap(l, left_preds)?, wrap(r, right_preds)?];
        let joined = LogicalPlan::Extension(Extension {
            node: Arc::new(AiNode::try_new(node.spec.clone(), inputs)?),
        });
        let out = match conjunction(keep) {
            Some(p) => LogicalPlan::Filter(Filter::try_new(p, Arc::new(joined))?),
            None => joined,
        };
        Ok(Transformed::yes(out))
    }
}

/// Which inputs of a join a predicate above it may move into: only a side whose
/// rows the join passes on as they are (not NULL-padded).
fn movable_sides(t: JoinType) -> (bool, bool) {
    match t {
        JoinType::Inner => (true, true),
        JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => {
            (true, false)
        }
        JoinType::Right | JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => {
            (false, true)
        }
        _ => (false, false),
    }
}

/// An AI filter over an AI join that reads one side only runs on that side
/// first: each of its documents is asked once either way, and every document it
/// drops takes its pairs out of the join's prompts.
fn ai_filter_below_ai_join(e: Extension) -> DfResult<Transformed<LogicalPlan>> {
    let unchanged = |e| Ok(Transformed::no(LogicalPlan::Extension(e)));
    let Some(filter) = e.node.as_any().downcast_ref::<AiNode>() else {
        return unchanged(e);
    };
    if filter.spec.shape != AiShape::Filter {
        return unchanged(e);
    }
    let LogicalPlan::Extension(child) = &filter.inputs[0] else {
        return unchanged(e);
    };
    let Some(join) = child.node.as_any().downcast_ref::<AiNode>() else {
        return unchanged(e);
    };
    let AiShape::Join(t) = join.spec.shape else {
        return unchanged(e);
    };
    let (left_ok, right_ok) = movable_sides(t);
    let reads = |schema: &DFSchema| {
        filter
            .spec
            .docs
            .iter()
            .all(|d| schema.has_column(&d.id) && schema.has_column(&d.text))
    };
    let mut inputs = join.inputs.clone();
    let side = if left_ok && reads(inputs[0].schema()) {
        0
    } else if right_ok && reads(inputs[1].schema()) {
        1
    } else {
        return unchanged(e);
    };
    inputs[side] = LogicalPlan::Extension(Extension {
        node: Arc::new(AiNode::try_new(
            filter.spec.clone(),
            vec![inputs[side].clone()],
        )?),
    });
    Ok(Transformed::yes(LogicalPlan::Extension(Extension {
        node: Arc::new(AiNode::try_new(join.spec.clone(), inputs)?),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::datasource::empty::EmptyTable;
    use datafusion::optimizer::OptimizerContext;
    use datafusion::prelude::SessionContext;

    /// DataFusion's plan of `sql`, not yet analyzed, over empty tables `t` and
    /// `u`, each `(id BIGINT, body VARCHAR, n BIGINT)`.
    async fn planned(sql: &str) -> LogicalPlan {
        let ctx = SessionContext::new();
        crate::exec::ai_functions::register_ai_functions(&ctx, None, None);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("body", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
        ]));
        for table in ["t", "u"] {
            ctx.register_table(table, Arc::new(EmptyTable::new(schema.clone())))
                .unwrap();
        }
        ctx.state().create_logical_plan(sql).await.unwrap()
    }

    /// `plan` through the AI rewrite alone.
    fn rewrite_with(plan: LogicalPlan, context: RewriteContext) -> DfResult<LogicalPlan> {
        AiRewrite::new(PromptFormat::default(), Arc::new(Mutex::new(context)))
            .analyze(plan, &ConfigOptions::default())
    }

    async fn rewrite(sql: &str) -> LogicalPlan {
        rewrite_with(planned(sql).await, RewriteContext::default())
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn error(sql: &str) -> String {
        match rewrite_with(planned(sql).await, RewriteContext::default()) {
            Ok(plan) => panic!("{sql} was rewritten:\n{}", plan.display_indent()),
            Err(e) => e.to_string(),
        }
    }

    /// The AI nodes of `plan`, the top one first.
    fn nodes(plan: &LogicalPlan) -> Vec<AiNode> {
        let mut found = Vec::new();
        plan.apply(|p| {
            if let LogicalPlan::Extension(e) = p
                && let Some(n) = e.node.as_any().downcast_ref::<AiNode>()
            {
                found.push(n.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        found
    }

    fn one_node(plan: &LogicalPlan) -> AiNode {
        let mut found = nodes(plan);
        assert_eq!(found.len(), 1, "{}", plan.display_indent());
        found.remove(0)
    }

    fn col(table: &str, name: &str) -> Column {
        Column::new(Some(table), name)
    }

    fn field_names(plan: &LogicalPlan) -> Vec<String> {
        plan.schema().field_names()
    }

    #[tokio::test]
    async fn an_ai_filter_runs_above_the_ordinary_predicates() {
        let sql = "SELECT t.id FROM t WHERE ai_filter('Is {0} kind?', t.body) AND t.n > 1";
        let plan = rewrite(sql).await;
        let node = one_node(&plan);
        assert_eq!(node.spec.shape, AiShape::Filter);
        assert_eq!(node.spec.call.op_id, "filter-1");
        assert_eq!(node.spec.call.template, "Is {0} kind?");
        assert_eq!(node.spec.call.tables, ["t"]);
        assert_eq!(node.spec.call.columns, ["body"]);
        // Without a unique id column, a document is keyed by its text.
        assert_eq!(
            node.spec.docs,
            [DocRef {
                alias: "t".into(),
                id: col("t", "body"),
                text: col("t", "body"),
            }]
        );
        let LogicalPlan::Filter(below) = &node.inputs[0] else {
            panic!("{}", plan.display_indent())
        };
        assert_eq!(below.predicate.to_string(), "t.n > Int64(1)");
        assert_eq!(field_names(&plan), ["t.id"]);
    }

    #[tokio::test]
    async fn ai_filters_run_cheapest_first_unless_a_hint_says_otherwise() {
        let long = "Read the following customer review carefully. Is {0} kind?";
        let short = "Is {0} short?";
        let sql = format!(
            "SELECT t.id FROM t WHERE ai_filter('{long}', t.body) AND ai_filter('{short}', t.body)"
        );
        // Top first: the cheaper filter is below, asked first, and numbered first.
        let order = |plan: &LogicalPlan| -> Vec<(String, String)> {
            nodes(plan)
                .into_iter()
                .map(|n| (n.spec.call.op_id, n.spec.call.template))
                .collect()
        };
        let unique = || RewriteContext {
            unique_id_tables: HashSet::from(["t".to_string()]),
            ..Default::default()
        };
        let plan = rewrite_with(planned(&sql).await, unique()).unwrap();
        assert_eq!(
            order(&plan),
            [
                ("filter-2".to_string(), long.to_string()),
                ("filter-1".to_string(), short.to_string())
            ]
        );
        // The table's ids are unique: documents are keyed by them.
        assert!(
            nodes(&plan)
                .iter()
                .all(|n| n.spec.docs[0].id == col("t", "id"))
        );

        // A short filter that keeps nearly every row is worth less than a long
        // one that keeps half.
        let hinted = RewriteContext {
            selectivity: HashMap::from([(short.to_string(), 0.99)]),
            ..unique()
        };
        let plan = rewrite_with(planned(&sql).await, hinted).unwrap();
        assert_eq!(
            order(&plan),
            [
                ("filter-2".to_string(), short.to_string()),
                ("filter-1".to_string(), long.to_string())
            ]
        );
    }

    #[tokio::test]
    async fn a_pair_predicate_over_a_join_becomes_an_ai_join_keyed_by_its_equalities() {
        let sql = "SELECT t.id, u.id FROM t, u \
                   WHERE ai_join('Does {0} cite {1}?', t.body, u.body) AND t.n = u.n AND t.id > 3";
        let plan = rewrite(sql).await;
        let node = one_node(&plan);
        assert_eq!(node.spec.shape, AiShape::Join(JoinType::Inner));
        assert_eq!(node.spec.call.op_id, "join-1");
        assert_eq!(node.spec.equalities, [(col("t", "n"), col("u", "n"))]);
        assert_eq!(node.spec.residual, None);
        let aliases: Vec<&str> = node.spec.docs.iter().map(|d| d.alias.as_str()).collect();
        assert_eq!(aliases, ["t", "u"]);
        assert_eq!(node.spec.call.relations, ["t", "u"]);
        // The one-sided condition is no join condition: a filter keeps it.
        let text = plan.display_indent().to_string();
        assert!(text.contains("Filter: t.id > Int64(3)"), "{text}");
        assert_eq!(field_names(&plan), ["t.id", "u.id"]);
    }

    #[tokio::test]
    async fn an_ai_call_in_an_outer_joins_on_keeps_the_join_type() {
        let sql = "SELECT t.id, u.id FROM t LEFT JOIN u \
                   ON ai_join('Does {0} cite {1}?', t.body, u.body) AND t.n = u.n \
                   AND ai_filter('Is {0} long?', u.body)";
        let plan = rewrite(sql).await;
        let found = nodes(&plan);
        assert_eq!(found.len(), 2, "{}", plan.display_indent());
        let join = &found[0];
        assert_eq!(join.spec.shape, AiShape::Join(JoinType::Left));
        assert_eq!(join.spec.equalities, [(col("t", "n"), col("u", "n"))]);
        // The condition on the side a LEFT JOIN does not preserve filters that
        // side first.
        let LogicalPlan::Extension(right) = &join.inputs[1] else {
            panic!("{}", plan.display_indent())
        };
        let filter = right.node.as_any().downcast_ref::<AiNode>().unwrap();
        assert_eq!(filter.spec.shape, AiShape::Filter);
        assert_eq!(filter.spec.docs[0].text, col("u", "body"));
        assert_eq!(field_names(&plan), ["t.id", "u.id"]);
    }

    #[tokio::test]
    async fn an_ai_call_on_the_preserved_side_of_an_outer_join_is_an_error() {
        let e = error(
            "SELECT t.id FROM t LEFT JOIN u ON ai_filter('Is {0} kind?', t.body) AND t.n = u.n",
        )
        .await;
        assert!(
            e.contains("ai_filter(Utf8(\"Is {0} kind?\"), t.body)"),
            "{e}"
        );
        assert!(
            e.contains("in the ON of a Left JOIN an AI call must read one document from each side"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_classification_in_a_projection_appends_its_label_column() {
        let sql = "SELECT t.id, ai_classify('Tone of {0}?', t.body, ['good', 'bad'], ['', '']) AS tone \
                   FROM t";
        let plan = rewrite(sql).await;
        let node = one_node(&plan);
        assert_eq!(node.spec.shape, AiShape::Project);
        assert_eq!(node.spec.call.op_id, "classify-1");
        assert_eq!(node.spec.call.labels, ["good", "bad"]);
        assert_eq!(node.spec.output, Some(Column::new_unqualified("__ai_1")));
        let LogicalPlan::Projection(p) = &plan else {
            panic!("{}", plan.display_indent())
        };
        assert_eq!(p.expr[1].to_string(), "__ai_1 AS tone");
        assert_eq!(field_names(&plan), ["t.id", "tone"]);
    }

    #[tokio::test]
    async fn an_ai_filter_inside_or_is_computed_as_a_value_the_filter_reads() {
        let plan =
            rewrite("SELECT t.id FROM t WHERE ai_filter('Is {0} kind?', t.body) OR t.n > 1").await;
        let node = one_node(&plan);
        assert_eq!(node.spec.shape, AiShape::Project);
        assert_eq!(node.spec.call.op_id, "filter-1");
        assert_eq!(node.spec.output, Some(Column::new_unqualified("__ai_1")));
        let text = plan.display_indent().to_string();
        assert!(text.contains("Filter: __ai_1 OR t.n > Int64(1)"), "{text}");
        assert_eq!(field_names(&plan), ["t.id"]);
    }

    #[tokio::test]
    async fn an_ai_agg_reduces_each_groups_texts() {
        let sql =
            "SELECT t.n, ai_agg('Summarise these reviews.', t.body) AS summary FROM t GROUP BY t.n";
        let plan = rewrite(sql).await;
        let node = one_node(&plan);
        assert_eq!(node.spec.shape, AiShape::Aggregate);
        assert_eq!(node.spec.call.op_id, "agg-1");
        assert!(node.spec.combine.is_some());
        // Its document is the group's list of texts, collected below.
        assert_eq!(node.spec.docs[0].text, Column::new_unqualified("__ai_1"));
        assert_eq!(node.spec.output, Some(Column::new_unqualified("__ai_2")));
        let LogicalPlan::Aggregate(a) = &node.inputs[0] else {
            panic!("{}", plan.display_indent())
        };
        assert_eq!(a.aggr_expr[0].to_string(), "array_agg(t.body) AS __ai_1");
        assert_eq!(field_names(&plan), ["t.n", "summary"]);
    }

    #[tokio::test]
    async fn malformed_calls_are_errors_naming_the_call() {
        for (sql, call, message) in [
            (
                "SELECT t.id FROM t WHERE ai_filter('Is {0} kind?')",
                "ai_filter(Utf8(\"Is {0} kind?\"))",
                "ai_filter takes (template, document) or (template, document, partner), \
                 not 1 argument(s)",
            ),
            (
                "SELECT t.id FROM t WHERE ai_filter(t.body, t.body)",
                "ai_filter(t.body, t.body)",
                "the template (first argument) must be a string literal, not t.body",
            ),
            (
                "SELECT t.id FROM t WHERE ai_filter('Is {0} big?', t.n)",
                "ai_filter(Utf8(\"Is {0} big?\"), t.n)",
                "{0}: the document t.n is Int64, not text",
            ),
            (
                "SELECT t.id FROM t WHERE ai_filter('Is {0} kind?', ai_complete('Summarise {0}', t.body))",
                "ai_filter(Utf8(\"Is {0} kind?\"), ai_complete(",
                "an AI call inside another AI call's argument",
            ),
            (
                "SELECT ai_classify('Tone of {0}?', t.body, ['good', 'bad'], ['']) FROM t",
                "ai_classify(Utf8(\"Tone of {0}?\"), t.body",
                "ai_classify: 2 labels but 1 descriptions",
            ),
        ] {
            let e = error(sql).await;
            assert!(e.contains(call), "{sql}: {e}");
            assert!(e.contains(message), "{sql}: {e}");
        }
    }

    #[tokio::test]
    async fn a_plan_without_ai_calls_comes_out_unchanged() {
        for sql in [
            "SELECT t.id FROM t JOIN u ON t.id = u.id WHERE t.n > 1",
            "SELECT t.n, count(*) FROM t LEFT JOIN u ON t.body = u.body GROUP BY t.n ORDER BY t.n",
        ] {
            let plan = planned(sql).await;
            let out = rewrite_with(plan.clone(), RewriteContext::default()).unwrap();
            assert_eq!(out, plan, "{sql}");
        }
    }

    #[tokio::test]
    async fn pushdown_moves_one_sided_predicates_into_an_ai_joins_inputs() {
        let push = |plan: LogicalPlan| {
            plan.transform_down(|p| AiJoinPredicatePushdown.rewrite(p, &OptimizerContext::new()))
                .unwrap()
                .data
        };
        // An ordinary predicate on `t` moves into the join's left input.
        let plan = rewrite(
            "SELECT t.id, u.id FROM t, u WHERE ai_join('Does {0} cite {1}?', t.body, u.body) AND t.n > 1",
        )
        .await;
        let join = one_node(&push(plan));
        let LogicalPlan::Filter(f) = &join.inputs[0] else {
            panic!("{:?}", join.inputs[0])
        };
        assert_eq!(f.predicate.to_string(), "t.n > Int64(1)");
        assert!(matches!(join.inputs[1], LogicalPlan::TableScan(_)));

        // An AI filter on `u` above the join moves below it, onto `u`.
        let plan = rewrite(
            "SELECT t.id, u.id FROM t, u \
             WHERE ai_join('Does {0} cite {1}?', t.body, u.body) AND ai_filter('Is {0} long?', u.body)",
        )
        .await;
        assert_eq!(nodes(&plan)[0].spec.shape, AiShape::Filter);
        let pushed = push(plan);
        let found = nodes(&pushed);
        assert_eq!(found[0].spec.shape, AiShape::Join(JoinType::Inner));
        assert!(matches!(found[0].inputs[0], LogicalPlan::TableScan(_)));
        let LogicalPlan::Extension(e) = &found[0].inputs[1] else {
            panic!("{}", pushed.display_indent())
        };
        assert_eq!(e.node.name(), "AiFilter");
    }
}
