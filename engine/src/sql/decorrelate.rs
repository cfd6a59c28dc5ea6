//! The analyzer rule that makes joins of the subqueries whose AI calls read
//! the outer query's columns, before the AI rewrite ([`super::rewrite`]): an AI
//! operator reads the rows of its inputs, never an outer row, so such a call
//! can only run once its subquery is a join with the outer query, where it is
//! the join's condition and the AI rewrite makes an AI join of that type.
//!
//! - `EXISTS`, `NOT EXISTS`, `IN` and `NOT IN` conjuncts of a `WHERE` become
//!   semi and anti joins, and such subqueries under `OR` or `NOT` mark joins,
//!   by DataFusion's own rule (`decorrelate_predicate_subquery`), run here
//!   rather than in the optimizer.
//! - `NOT IN` is an anti join on `(x = y) IS NOT FALSE`, not DataFusion's
//!   null-aware anti join: that one drops every outer row once any subquery row
//!   has a NULL `y`, whichever outer row the AI call kept it for.
//! - A scalar aggregate subquery (`(SELECT count(*) FROM t WHERE
//!   ai_filter(..., o.x, t.y))`), which DataFusion decorrelates only on
//!   equalities, becomes a left join on the AI call, grouped by outer row: each
//!   outer row is numbered, and the aggregates count only rows that matched, so
//!   an outer row without a match gets what the aggregate gives on no rows
//!   (`count` 0, `sum` NULL).
//!
//! Anything else that still reads an outer column in an AI call is refused,
//! naming the subquery and the call. Plans without such calls pass unchanged:
//! their subqueries are decorrelated by the optimizer, as always.

use std::sync::{Arc, Mutex};

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, JoinType};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::functions_window::expr_fn::row_number;
use datafusion::logical_expr::expr::{Exists, InSubquery};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::{conjunction, split_conjunction, split_conjunction_owned};
use datafusion::logical_expr::{
    BinaryExpr, Expr, ExprSchemable, Filter, Join, LogicalPlan, LogicalPlanBuilder, Operator,
    Projection, Subquery, lit,
};
use datafusion::optimizer::analyzer::AnalyzerRule;
use datafusion::optimizer::decorrelate::PullUpCorrelatedExpr;
use datafusion::optimizer::decorrelate_predicate_subquery::DecorrelatePredicateSubquery;
use datafusion::optimizer::{Optimizer, OptimizerConfig, OptimizerContext};

use crate::exec::ai_functions::{ai_call_of, contains_ai_call};

use super::rewrite::{RewriteContext, describe_call, has_outer_reference};

/// Where the aliases of the subqueries joined here start. The optimizer's own
/// alias generator counts from 1 for subqueries it decorrelates later (an
/// `x > ANY (...)` it rewrites first), and the two must not name two inputs of
/// one join alike.
const ALIAS_BASE: usize = 1_000_000;

/// The analyzer rule; it runs before [`super::rewrite::AiRewrite`].
#[derive(Debug)]
pub struct AiDecorrelate {
    context: Arc<Mutex<RewriteContext>>,
}

impl AiDecorrelate {
    /// A rule naming calls in errors as `context` places them in the SQL.
    pub fn new(context: Arc<Mutex<RewriteContext>>) -> Self {
        Self { context }
    }
}

impl AnalyzerRule for AiDecorrelate {
    fn name(&self) -> &str {
        "ai_decorrelate"
    }

    fn analyze(&self, plan: LogicalPlan, config: &ConfigOptions) -> DfResult<LogicalPlan> {
        if outer_ai_call(&plan).is_none() {
            return Ok(plan);
        }
        let context = self.context.lock().expect("rewrite context lock");
        refuse_nullable_embedded_in(&plan, &context)?;
        let mut numbers = 0;
        let plan = plan
            .transform_up_with_subqueries(|p| scalar_subqueries(p, &mut numbers, &context))
            .data()?;
        let optimizer_context = OptimizerContext::new_with_config_options(Arc::new(config.clone()));
        optimizer_context
            .alias_generator()
            .update_min_id(ALIAS_BASE);
        let plan = Optimizer::with_rules(vec![Arc::new(DecorrelatePredicateSubquery::new())])
            .optimize(plan, &optimizer_context, |_, _| {})?;
        let plan = plan.transform_up_with_subqueries(explicit_not_in).data()?;
        let plan = plan
            .transform_up_with_subqueries(carry_partner_ids)
            .data()?;
        refuse_remaining(&plan, &context)?;
        Ok(plan)
    }
}

/// Whether `e` is an AI call with an outer column among its arguments.
fn reads_outer(e: &Expr) -> bool {
    ai_call_of(e).is_some_and(|(_, args)| args.iter().any(has_outer_reference))
}

/// The first AI call in `plan`, its subqueries included, that reads an outer
/// column.
fn outer_ai_call(plan: &LogicalPlan) -> Option<Expr> {
    let mut found = None;
    let _ = plan.apply_with_subqueries(|p| {
        p.apply_expressions(|e| {
            e.apply(|x| {
                if reads_outer(x) {
                    found = Some(x.clone());
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(if found.is_some() {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found
}

/// The subquery of a subquery expression, and how SQL spells its kind.
fn subquery_of(e: &Expr) -> Option<(&Subquery, &'static str)> {
    match e {
        Expr::Exists(Exists { subquery, negated }) => {
            Some((subquery, if *negated { "NOT EXISTS" } else { "EXISTS" }))
        }
        Expr::InSubquery(InSubquery {
            subquery, negated, ..
        }) => Some((subquery, if *negated { "NOT IN" } else { "IN" })),
        Expr::ScalarSubquery(subquery) => Some((subquery, "scalar")),
        Expr::SetComparison(s) => Some((&s.subquery, "ANY/ALL")),
        _ => None,
    }
}

fn refused(context: &RewriteContext, kind: &str, call: &Expr, why: &str) -> DataFusionError {
    DataFusionError::Plan(format!(
        "the {kind} subquery with {}: its AI call reads the outer query's columns, and {why}; \
         write it as a join",
        describe_call(context, call)
    ))
}

/// Refuses an `IN` under `OR`, `NOT` or `CASE` whose AI call reads outer
/// columns when either side of its comparison may be NULL: DataFusion's mark
/// join says FALSE where SQL says NULL (`NOT (x IN ...)` would keep the row).
fn refuse_nullable_embedded_in(plan: &LogicalPlan, context: &RewriteContext) -> DfResult<()> {
    plan.apply_with_subqueries(|p| {
        let LogicalPlan::Filter(f) = p else {
            return Ok(TreeNodeRecursion::Continue);
        };
        for conjunct in split_conjunction(&f.predicate) {
            let top = match conjunct {
                Expr::Not(inner) => inner.as_ref(),
                other => other,
            };
            conjunct.apply(|e| {
                let Expr::InSubquery(InSubquery {
                    expr,
                    subquery,
                    negated,
                }) = e
                else {
                    return Ok(TreeNodeRecursion::Continue);
                };
                if std::ptr::eq(e, top) {
                    return Ok(TreeNodeRecursion::Jump);
                }
                let Some(call) = outer_ai_call(&subquery.subquery) else {
                    return Ok(TreeNodeRecursion::Jump);
                };
                let inner = subquery.subquery.schema();
                let nullable = expr.nullable(f.input.schema().as_ref())?
                    || inner.fields().iter().any(|field| field.is_nullable());
                if nullable {
                    let kind = if *negated { "NOT IN" } else { "IN" };
                    return Err(refused(
                        context,
                        kind,
                        &call,
                        "inside OR, NOT or CASE it would be answered FALSE where SQL answers \
                         NULL (its values may be NULL); use EXISTS with the comparison inside",
                    ));
                }
                Ok(TreeNodeRecursion::Jump)
            })?;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(())
}

/// Refuses what decorrelation left with an AI call reading outer columns,
/// naming the subquery.
fn refuse_remaining(plan: &LogicalPlan, context: &RewriteContext) -> DfResult<()> {
    let mut failure = None;
    plan.apply_with_subqueries(|p| {
        p.apply_expressions(|e| {
            e.apply(|x| {
                if let Some((subquery, kind)) = subquery_of(x)
                    && let Some(call) = outer_ai_call(&subquery.subquery)
                {
                    failure = Some(refused(
                        context,
                        kind,
                        &call,
                        "only EXISTS, NOT EXISTS, IN and NOT IN in WHERE and scalar \
                         aggregates without GROUP BY in SELECT or WHERE can be made joins",
                    ));
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(if failure.is_some() {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    // A lateral join's subquery is a plan, not an expression.
    match outer_ai_call(plan) {
        Some(call) => Err(refused(
            context,
            "correlated",
            &call,
            "it is no EXISTS, IN or scalar subquery that can be made a join",
        )),
        None => Ok(()),
    }
}

/// A null-aware anti join (`NOT IN`) whose condition holds an AI call, as an
/// ordinary anti join on `(x = y) IS NOT FALSE`: per outer row, only the
/// subquery rows its AI call keeps may hold the NULL that makes `NOT IN` NULL.
fn explicit_not_in(plan: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
    let LogicalPlan::Join(join) = plan else {
        return Ok(Transformed::no(plan));
    };
    if !join.null_aware || !join.filter.as_ref().is_some_and(contains_ai_call) {
        return Ok(Transformed::no(LogicalPlan::Join(join)));
    }
    // DataFusion writes the IN comparison first, before the subquery's own
    // correlated conditions, and no keys yet.
    let mut conjuncts = split_conjunction_owned(join.filter.clone().expect("a condition"));
    let is_comparison = matches!(
        conjuncts.first(),
        Some(Expr::BinaryExpr(BinaryExpr {
            op: Operator::Eq,
            ..
        }))
    );
    if !join.on.is_empty() || !is_comparison {
        return Err(DataFusionError::Plan(format!(
            "a NOT IN subquery with an AI call over the outer query's columns came out of \
             decorrelation as {}, not as the anti join this rule knows; write it as NOT EXISTS",
            LogicalPlan::Join(join).display()
        )));
    }
    conjuncts[0] = Expr::IsNotFalse(Box::new(conjuncts[0].clone()));
    Ok(Transformed::yes(LogicalPlan::Join(Join::try_new(
        join.left,
        join.right,
        join.on,
        conjunction(conjuncts),
        join.join_type,
        join.join_constraint,
        join.null_equality,
        false,
    )?)))
}

/// A semi, anti or mark join made of a subquery whose AI call reads one of the subquery's
/// columns as a document: the subquery's output gains, beside it, the `id` of
/// the relation that column comes from, when that relation has one and the
/// output has no `id` yet. The AI rewrite then keys the document by its id,
/// as in the join written by hand, not by its text: a backend that answers
/// by document id (the labelled oracle, the answer cache's tables) answers
/// it. Unused, the column is pruned after the rewrite.
fn carry_partner_ids(plan: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
    let LogicalPlan::Join(join) = plan else {
        return Ok(Transformed::no(plan));
    };
    // Only the joins decorrelation made: their output is the outer rows
    // (and a mark), whatever columns the subquery gains.
    let made_here = matches!(
        join.join_type,
        JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark
    );
    let (Some(filter), LogicalPlan::SubqueryAlias(alias), true) =
        (&join.filter, join.right.as_ref(), made_here)
    else {
        return Ok(Transformed::no(LogicalPlan::Join(join)));
    };
    let LogicalPlan::Projection(projection) = alias.input.as_ref() else {
        return Ok(Transformed::no(LogicalPlan::Join(join)));
    };
    let out = projection.schema.as_ref();
    if out.fields().iter().any(|f| f.name() == "id") {
        return Ok(Transformed::no(LogicalPlan::Join(join)));
    }
    // The subquery's columns read as documents, by their name in its output.
    let mut documents = Vec::new();
    filter.apply(|e| {
        if let Some((_, args)) = ai_call_of(e) {
            for arg in args {
                if let Expr::Column(c) = arg
                    && c.relation.as_ref() == Some(&alias.alias)
                {
                    documents.push(c.name.clone());
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut ids: Vec<Column> = Vec::new();
    for name in documents {
        let Some((Some(relation), _)) = out
            .iter()
            .find(|(_, f)| f.name() == &name)
            .map(|(q, f)| (q.cloned(), f))
        else {
            continue;
        };
        let id = Column::new(Some(relation), "id");
        if projection.input.schema().has_column(&id) && !ids.contains(&id) {
            ids.push(id);
        }
    }
    // Two relations' ids would be one `id` in the subquery's output.
    if ids.len() != 1 {
        return Ok(Transformed::no(LogicalPlan::Join(join)));
    }
    let mut expr = projection.expr.clone();
    expr.extend(ids.into_iter().map(Expr::Column));
    let input = LogicalPlan::Projection(Projection::try_new(expr, projection.input.clone())?);
    let right = LogicalPlanBuilder::from(input)
        .alias(alias.alias.clone())?
        .build()?;
    Ok(Transformed::yes(LogicalPlan::Join(Join::try_new(
        join.left,
        Arc::new(right),
        join.on,
        join.filter,
        join.join_type,
        join.join_constraint,
        join.null_equality,
        join.null_aware,
    )?)))
}

/// A `Filter` or `Projection` whose scalar subqueries read outer columns in AI
/// calls, with each subquery a left join below it.
fn scalar_subqueries(
    plan: LogicalPlan,
    numbers: &mut usize,
    context: &RewriteContext,
) -> DfResult<Transformed<LogicalPlan>> {
    if !matches!(plan, LogicalPlan::Filter(_) | LogicalPlan::Projection(_)) {
        return Ok(Transformed::no(plan));
    }
    let mut subqueries: Vec<Expr> = Vec::new();
    for e in plan.expressions() {
        e.apply(|x| {
            if let Expr::ScalarSubquery(s) = x
                && outer_ai_call(&s.subquery).is_some()
                && !subqueries.contains(x)
            {
                subqueries.push(x.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
    }
    if subqueries.is_empty() {
        return Ok(Transformed::no(plan));
    }
    let mut input = plan.inputs()[0].clone();
    let mut values = Vec::with_capacity(subqueries.len());
    for e in &subqueries {
        let Expr::ScalarSubquery(s) = e else {
            unreachable!("collected as scalar subqueries")
        };
        *numbers += 1;
        let (joined, value) = scalar_join(input, s, *numbers, context)?;
        input = joined;
        values.push(value);
    }
    let replace = |e: Expr| -> DfResult<Expr> {
        e.transform_down(|x| match subqueries.iter().position(|s| *s == x) {
            Some(i) => Ok(Transformed::new(
                values[i].clone(),
                true,
                TreeNodeRecursion::Jump,
            )),
            None => Ok(Transformed::no(x)),
        })
        .data()
    };
    let rebuilt = match plan {
        LogicalPlan::Filter(f) => {
            let filtered = Filter::try_new(replace(f.predicate)?, Arc::new(input))?;
            let columns = f.input.schema().columns().into_iter().map(Expr::Column);
            LogicalPlan::Projection(Projection::try_new(
                columns.collect(),
                Arc::new(LogicalPlan::Filter(filtered)),
            )?)
        }
        LogicalPlan::Projection(p) => {
            let preserver = NamePreserver::new_for_projection();
            let exprs = p
                .expr
                .into_iter()
                .map(|e| {
                    let name = preserver.save(&e);
                    Ok(name.restore(replace(e)?))
                })
                .collect::<DfResult<Vec<_>>>()?;
            LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input))?)
        }
        _ => unreachable!("a filter or projection"),
    };
    Ok(Transformed::yes(rebuilt))
}

/// `outer` left-joined to scalar subquery `s` and grouped back to one row per
/// outer row (numbered `__ai_row_<n>`), and the subquery's value over that.
fn scalar_join(
    outer: LogicalPlan,
    s: &Subquery,
    n: usize,
    context: &RewriteContext,
) -> DfResult<(LogicalPlan, Expr)> {
    let call = outer_ai_call(&s.subquery).expect("an AI call over outer columns");
    let unsupported = |why: &str| refused(context, "scalar", &call, why);
    let shape = "only an aggregate without GROUP BY (SELECT count(*) FROM t WHERE ...) \
                 can be made a join";
    let (value, aggregate) = match s.subquery.as_ref() {
        LogicalPlan::Projection(p) => match (p.expr.as_slice(), p.input.as_ref()) {
            ([value], LogicalPlan::Aggregate(a)) => (value.clone().unalias(), a),
            _ => return Err(unsupported(shape)),
        },
        LogicalPlan::Aggregate(a) => (Expr::Column(a.schema.columns()[0].clone()), a),
        _ => return Err(unsupported(shape)),
    };
    if !aggregate.group_expr.is_empty()
        || has_outer_reference(&value)
        || aggregate.aggr_expr.iter().any(has_outer_reference)
    {
        return Err(unsupported(shape));
    }
    let mut pull = PullUpCorrelatedExpr::new();
    let below = Arc::unwrap_or_clone(aggregate.input.clone())
        .rewrite(&mut pull)
        .data()?;
    let Some(condition) = conjunction(pull.join_filters.clone()).filter(|_| pull.can_pull_up)
    else {
        return Err(unsupported(
            "its outer columns are read outside the conditions of its WHERE",
        ));
    };
    let matched = Column::new_unqualified(format!("__ai_match_{n}"));
    let below = LogicalPlanBuilder::from(below);
    let columns = below.schema().columns().into_iter().map(Expr::Column);
    let right = below
        .project(columns.chain([lit(true).alias(&matched.name)]))?
        .build()?;
    let row = Column::new_unqualified(format!("__ai_row_{n}"));
    let windowed = LogicalPlanBuilder::from(outer.clone())
        .window(vec![row_number()])?
        .build()?;
    let number = windowed.schema().columns().pop().expect("the row number");
    let numbered = LogicalPlanBuilder::from(windowed)
        .project(
            outer
                .schema()
                .columns()
                .into_iter()
                .map(Expr::Column)
                .chain([Expr::Column(number).alias(&row.name)]),
        )?
        .build()?;
    if let Err(e) = numbered.schema().join(right.schema()) {
        return Err(unsupported(&format!(
            "its columns clash with the outer query's ({e}); give its tables other aliases"
        )));
    }
    let joined = LogicalPlanBuilder::from(numbered)
        .join_on(right, JoinType::Left, [condition])?
        .build()?;
    // Rows padded for an outer row without a match count for no aggregate.
    let only_matched = Expr::Column(matched).is_not_null();
    // Each value gets a name of its own: the outer query may already hold a
    // `count(*)`, another subquery's.
    let mut names = std::collections::HashMap::new();
    let aggregates = aggregate
        .aggr_expr
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let own = format!("__ai_value_{n}_{i}");
            names.insert(e.schema_name().to_string(), own.clone());
            match e.clone().unalias() {
                Expr::AggregateFunction(mut f) => {
                    let filter = match f.params.filter.take() {
                        Some(own) => only_matched.clone().and(*own),
                        None => only_matched.clone(),
                    };
                    f.params.filter = Some(Box::new(filter));
                    Ok(Expr::AggregateFunction(f).alias(own))
                }
                _ => Err(unsupported(shape)),
            }
        })
        .collect::<DfResult<Vec<_>>>()?;
    let groups = std::iter::once(Expr::Column(row))
        .chain(outer.schema().columns().into_iter().map(Expr::Column));
    let grouped = LogicalPlanBuilder::from(joined)
        .aggregate(groups, aggregates)?
        .build()?;
    let value = value
        .transform(|e| match &e {
            Expr::Column(c) if c.relation.is_none() && names.contains_key(&c.name) => Ok(
                Transformed::yes(Expr::Column(Column::new_unqualified(&names[&c.name]))),
            ),
            _ => Ok(Transformed::no(e)),
        })
        .data()?;
    Ok((grouped, value))
}
