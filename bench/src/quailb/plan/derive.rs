//! The QUAIL-B view of a query, derived from DataFusion's analyzed plan of it:
//! relations from the aliased scans, operators from the AI nodes (their ids,
//! prompts and documents are the nodes' own) and the IN-list filters, the
//! selected columns from the projections on top, and the operator tree that
//! `explain` draws. One walk, root to scans. A plan of another shape is a
//! [`crate::error::BenchError::NotQuailb`] (it may run as a general query); a plan of
//! QUAIL-B's shape that breaks one of its rules (SPEC §A) is invalid.

use std::collections::HashMap;

use datafusion::common::{Column, ScalarValue};
use datafusion::logical_expr::expr::InList;
use datafusion::logical_expr::{Expr, LogicalPlan};

use crate::error::Result;
use aisql_engine::exec::logical::{AiNode, AiShape};
use aisql_engine::inference::backend::AiKind;

use crate::quailb::consumer::OperatorHint;

use super::{Operator, PlanTree, Relation, Selected, invalid, not_quailb};

/// What [`derive`] finds.
pub(super) struct Derived {
    pub relations: Vec<Relation>,
    pub operators: Vec<Operator>,
    pub select: Vec<Selected>,
    pub tree: PlanTree,
}

/// Derives the view of `plan` (analyzed: AI calls are AI nodes). `hints` are the
/// operator id hints of the Substrait relations below the root, in post-order;
/// `root_names` the names the root gives its columns.
pub(super) fn derive(
    plan: &LogicalPlan,
    hints: &[OperatorHint],
    root_names: &[String],
) -> Result<Derived> {
    let mut d = Deriver::default();
    let mut forest = d.node(plan)?;
    for (i, o) in d.operators.iter().enumerate() {
        if let Operator::Classify { id, output, .. } = o
            && output.is_empty()
        {
            return Err(invalid(format!(
                "{id}: no output name hint for the label column (operator {i})"
            )));
        }
    }
    d.check_hints(hints)?;
    let select = d.select(plan, root_names)?;
    let tree = match (forest.pop(), forest.is_empty()) {
        (Some(tree), true) => tree,
        _ => {
            return Err(not_quailb(
                "the plan is not one tree of operators over its scans",
            ));
        }
    };
    for r in &mut d.relations {
        r.text_column =
            d.text_columns.get(&r.alias).cloned().ok_or_else(|| {
                not_quailb(format!("relation {} is read by no AI function", r.alias))
            })?;
    }
    Ok(Derived {
        relations: d.relations,
        operators: d.operators,
        select,
        tree,
    })
}

#[derive(Default)]
struct Deriver {
    relations: Vec<Relation>,
    operators: Vec<Operator>,
    /// Per alias, the text column AI functions read.
    text_columns: HashMap<String, String>,
    /// The column an AI node appends -> its operator.
    appended: HashMap<Column, usize>,
    /// Label columns (alias, column) -> their classification.
    labels: HashMap<(String, String), usize>,
    in_lists: usize,
}

/// A column's relation alias ("" when unqualified).
fn alias_of(c: &Column) -> String {
    c.relation
        .as_ref()
        .map(|r| r.table().to_string())
        .unwrap_or_default()
}

impl Deriver {
    /// The operator subtrees of `plan` (one, or none for a bare scan's
    /// projection); scans are leaves.
    fn node(&mut self, plan: &LogicalPlan) -> Result<Vec<PlanTree>> {
        match plan {
            LogicalPlan::SubqueryAlias(a) => match a.input.as_ref() {
                LogicalPlan::TableScan(scan) => {
                    let alias = a.alias.table().to_string();
                    if self.relations.iter().any(|r| r.alias == alias) {
                        return Err(invalid(format!("alias {alias:?} is used twice")));
                    }
                    let columns: Vec<String> = scan
                        .projected_schema
                        .fields()
                        .iter()
                        .map(|f| f.name().clone())
                        .collect();
                    let table = scan.table_name.table().to_string();
                    if columns.first().map(String::as_str) != Some("id") {
                        return Err(not_quailb(format!(
                            "the read of {table} must list `id` first, found {columns:?}"
                        )));
                    }
                    self.relations.push(Relation {
                        alias,
                        table,
                        columns,
                        text_column: String::new(),
                    });
                    Ok(vec![PlanTree::Scan(self.relations.len() - 1)])
                }
                _ => Err(not_quailb(format!(
                    "subquery {} is not part of a QUAIL-B plan",
                    a.alias
                ))),
            },
            LogicalPlan::Projection(p) => {
                let below = self.node(&p.input)?;
                self.name_labels(p)?;
                Ok(below)
            }
            LogicalPlan::Filter(f) => {
                let below = self.node(&f.input)?;
                let op = self.in_list(&f.predicate)?;
                Ok(vec![PlanTree::Operator(op, below)])
            }
            LogicalPlan::Extension(e) => {
                let Some(node) = e.node.as_any().downcast_ref::<AiNode>() else {
                    return Err(not_quailb(format!(
                        "{} is not part of a QUAIL-B plan",
                        e.node.name()
                    )));
                };
                let mut below = Vec::new();
                for input in &node.inputs {
                    below.extend(self.node(input)?);
                }
                let op = self.ai_node(node)?;
                Ok(vec![PlanTree::Operator(op, below)])
            }
            LogicalPlan::Join(_) => Err(not_quailb(
                "a join whose condition calls no ai_join is not part of a QUAIL-B plan",
            )),
            LogicalPlan::TableScan(s) => Err(not_quailb(format!(
                "the read of {} has no alias hint",
                s.table_name
            ))),
            other => Err(not_quailb(format!(
                "{} is not part of a QUAIL-B plan (filters, joins, projections and reads only)",
                other.display()
            ))),
        }
    }

    fn text_column(&mut self, alias: &str, column: &str, id: &str) -> Result<()> {
        match self.text_columns.get(alias) {
            Some(c) if c != column => Err(not_quailb(format!(
                "{id}: relation {alias} is read through two text columns ({c}, {column})"
            ))),
            _ => {
                self.text_columns.insert(alias.into(), column.into());
                Ok(())
            }
        }
    }

    fn ai_node(&mut self, node: &AiNode) -> Result<usize> {
        let spec = &node.spec;
        let call = &spec.call;
        let id = call.op_id.clone();
        for d in &spec.docs {
            if d.alias != alias_of(&d.text) {
                return Err(not_quailb(format!(
                    "{id}: document {} is not a column of a read",
                    d.text
                )));
            }
            self.text_column(&d.alias, &d.text.name, &id)?;
        }
        let alias = spec.docs[0].alias.clone();
        let op = match (spec.shape, call.kind) {
            (AiShape::Filter, AiKind::Filter) => Operator::Filter {
                id,
                alias,
                template: call.template.clone(),
            },
            (AiShape::Join(datafusion::common::JoinType::Inner), AiKind::Join)
                if spec.residual.is_none() =>
            {
                let aliases = [alias, spec.docs[1].alias.clone()];
                let mut on = Vec::new();
                for (a, b) in &spec.equalities {
                    if alias_of(a) != aliases[0] || alias_of(b) != aliases[1] {
                        return Err(not_quailb(format!(
                            "{id}: equality {a} = {b} must compare the two ai_join relations"
                        )));
                    }
                    on.push((a.name.clone(), b.name.clone()));
                }
                Operator::Join {
                    id,
                    aliases,
                    template: call.template.clone(),
                    on,
                }
            }
            (AiShape::Join(t), AiKind::Join) => {
                return Err(not_quailb(format!(
                    "{id}: only inner AI joins whose condition is ai_join and equalities are \
                     part of a QUAIL-B plan (this one is {t})"
                )));
            }
            (AiShape::Project, AiKind::Classify) => {
                let output = spec
                    .output
                    .clone()
                    .ok_or_else(|| invalid(format!("{id}: a classification appends no column")))?;
                self.appended.insert(output, self.operators.len());
                Operator::Classify {
                    id,
                    alias,
                    partner: spec.docs.get(1).map(|d| d.alias.clone()),
                    template: call.template.clone(),
                    labels: call.labels.clone(),
                    descriptions: call.descriptions.clone(),
                    output: String::new(),
                }
            }
            (shape, kind) => {
                return Err(not_quailb(format!(
                    "{id}: an AI {kind:?} used as {shape:?} is not part of a QUAIL-B plan"
                )));
            }
        };
        self.operators.push(op);
        Ok(self.operators.len() - 1)
    }

    /// Names the label columns a projection gives the classifications below it.
    fn name_labels(&mut self, p: &datafusion::logical_expr::Projection) -> Result<()> {
        for (e, (qualifier, field)) in p.expr.iter().zip(p.schema.iter()) {
            let Expr::Column(c) = unalias(e) else {
                continue;
            };
            let Some(&op) = self.appended.get(c) else {
                continue;
            };
            let Operator::Classify {
                id, alias, output, ..
            } = &mut self.operators[op]
            else {
                unreachable!("appended columns are classifications'")
            };
            let owner = qualifier.map(|q| q.table().to_string()).unwrap_or_default();
            if owner != *alias {
                return Err(invalid(format!(
                    "{id}: label column {owner}.{} must belong to the anchor alias {alias}",
                    field.name()
                )));
            }
            if !output.is_empty() && output != field.name() {
                continue;
            }
            *output = field.name().clone();
            self.labels
                .insert((alias.clone(), field.name().clone()), op);
        }
        Ok(())
    }

    fn in_list(&mut self, predicate: &Expr) -> Result<usize> {
        let Expr::InList(InList {
            expr,
            list,
            negated: false,
        }) = predicate
        else {
            return Err(not_quailb(format!(
                "filter condition {} is neither ai_filter nor an IN-list on a label column",
                aisql_engine::inference::prompt::shorten(&predicate.to_string(), 96)
            )));
        };
        self.in_lists += 1;
        let id = format!("in-list-{}", self.in_lists);
        let Expr::Column(c) = unalias(expr) else {
            return Err(not_quailb(format!(
                "{id}: the IN-list does not test a column"
            )));
        };
        let (alias, output) = (alias_of(c), c.name.clone());
        let op = *self
            .labels
            .get(&(alias.clone(), output.clone()))
            .ok_or_else(|| {
                not_quailb(format!(
                    "{id}: {alias}.{output} is not the label column of a classification"
                ))
            })?;
        let Operator::Classify {
            id: classify_id,
            labels,
            partner,
            ..
        } = &self.operators[op]
        else {
            unreachable!("label columns are classifications'")
        };
        if partner.is_some() {
            return Err(invalid(format!(
                "{id}: IN-lists apply to one-document classifications only"
            )));
        }
        let mut accepted = Vec::new();
        for o in list {
            let s = match unalias(o) {
                Expr::Literal(ScalarValue::Utf8(Some(s)), _)
                | Expr::Literal(ScalarValue::LargeUtf8(Some(s)), _)
                | Expr::Literal(ScalarValue::Utf8View(Some(s)), _) => s.clone(),
                other => {
                    return Err(not_quailb(format!(
                        "{id}: option {other} is not a string literal"
                    )));
                }
            };
            if !labels.contains(&s) || accepted.contains(&s) {
                return Err(invalid(format!(
                    "{id}: option {s:?} is not a distinct label of {classify_id}"
                )));
            }
            accepted.push(s);
        }
        self.operators.push(Operator::InList {
            id,
            alias,
            output,
            accepted,
        });
        Ok(self.operators.len() - 1)
    }

    /// Pairs the operators with the Substrait relations' id hints: each relation
    /// carries one operator, and a hint must be the id post-order numbering gives
    /// (the 42-query line's `label-filter-N` for IN-lists is kept as the id).
    fn check_hints(&mut self, hints: &[OperatorHint]) -> Result<()> {
        if hints.len() != self.operators.len() {
            return Err(invalid(format!(
                "the plan has {} filters, joins and projections below its root, but {} \
                 operators: each must carry exactly one AI call or IN-list",
                hints.len(),
                self.operators.len()
            )));
        }
        for (op, hint) in self.operators.iter_mut().zip(hints) {
            let relation = match op {
                Operator::Filter { .. } | Operator::InList { .. } => "filter",
                Operator::Join { .. } => "join",
                Operator::Classify { .. } => "project",
            };
            if relation != hint.relation {
                return Err(invalid(format!(
                    "{}: expected in a {relation} relation, found in a {}",
                    op.id(),
                    hint.relation
                )));
            }
            let Some(given) = &hint.id else { continue };
            if let Operator::InList { id, .. } = op
                && given.strip_prefix("label-filter-") == id.strip_prefix("in-list-")
            {
                *id = given.clone();
            }
            if given != op.id() {
                return Err(invalid(format!(
                    "operator id {given:?} breaks post-order numbering (expected {:?})",
                    op.id()
                )));
            }
        }
        Ok(())
    }

    /// The selected columns: each output column of the plan traced through the
    /// projections on top to a relation's `id` or a label column.
    fn select(&self, plan: &LogicalPlan, root_names: &[String]) -> Result<Vec<Selected>> {
        let is_selectable = |c: &Column| {
            let alias = alias_of(c);
            (c.name == "id" && self.relations.iter().any(|r| r.alias == alias))
                || self.labels.contains_key(&(alias, c.name.clone()))
        };
        let mut select = Vec::new();
        for (i, column) in plan.schema().columns().into_iter().enumerate() {
            let mut c = column.clone();
            let mut node = plan;
            while !is_selectable(&c) {
                let LogicalPlan::Projection(p) = node else {
                    break;
                };
                let index = p
                    .schema
                    .index_of_column(&c)
                    .map_err(|e| invalid(e.to_string()))?;
                match unalias(&p.expr[index]) {
                    Expr::Column(inner) => c = inner.clone(),
                    _ => break,
                }
                node = &p.input;
            }
            if !is_selectable(&c) {
                return Err(not_quailb(format!(
                    "root selects {c}, which is neither an id nor a label column"
                )));
            }
            let (alias, column) = (alias_of(&c), c.name.clone());
            let name = if column == "id" {
                alias.clone()
            } else {
                column.clone()
            };
            if let Some(n) = root_names.get(i)
                && *n != name
            {
                return Err(invalid(format!(
                    "root column {n:?} should be named {name:?} (SPEC §A.7)"
                )));
            }
            select.push(Selected {
                alias,
                column,
                name,
            });
        }
        if !root_names.is_empty() && root_names.len() != select.len() {
            return Err(invalid(format!(
                "the root names {} columns but selects {}",
                root_names.len(),
                select.len()
            )));
        }
        Ok(select)
    }
}

fn unalias(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => unalias(&a.expr),
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use aisql_engine::EngineError;
    use aisql_engine::sql::plan_file::decode_plan;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::logical_expr::{LogicalPlanBuilder, col, lit, table_scan};

    use crate::error::BenchError;

    /// The catalog plan `id` (`IMDB-1`) as JSON.
    fn catalog_json(id: &str) -> serde_json::Value {
        let path = super::super::tests::plans_dir().join(format!("{id}.json"));
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// The view of a plan (as JSON) whose root names its columns `names`.
    fn view_of(json: serde_json::Value, names: &[&str]) -> Result<Derived> {
        let plan = decode_plan(json.to_string().as_bytes(), true).unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        super::super::derive_view(&plan, &names, Default::default()).map(|(_, view)| view)
    }

    fn view(id: &str, names: &[&str]) -> Derived {
        view_of(catalog_json(id), names).unwrap_or_else(|e| panic!("{id}: {e}"))
    }

    fn relation(alias: &str, table: &str, columns: [&str; 2]) -> Relation {
        Relation {
            alias: alias.into(),
            table: table.into(),
            columns: columns.map(String::from).to_vec(),
            text_column: columns[1].into(),
        }
    }

    fn selected(alias: &str, column: &str, name: &str) -> Selected {
        Selected {
            alias: alias.into(),
            column: column.into(),
            name: name.into(),
        }
    }

    fn ids(d: &Derived) -> Vec<&str> {
        d.operators.iter().map(|o| o.id()).collect()
    }

    /// An empty read of `table(columns...)`, all text.
    fn scan(table: &str, columns: &[&str]) -> LogicalPlanBuilder {
        let fields: Vec<Field> = columns
            .iter()
            .map(|c| Field::new(*c, DataType::Utf8, false))
            .collect();
        table_scan(Some(table), &Schema::new(fields), None).unwrap()
    }

    /// `scan` under the alias hint `alias`, as QUAIL-B's consumer reads it.
    fn read(table: &str, alias: &str, columns: &[&str]) -> LogicalPlanBuilder {
        scan(table, columns).alias(alias).unwrap()
    }

    #[test]
    fn a_filter_plan_has_one_relation_one_filter_and_its_ids() {
        let d = view("IMDB-1", &["r"]);
        assert_eq!(d.relations, [relation("r", "reviews", ["id", "body"])]);
        let [
            Operator::Filter {
                id,
                alias,
                template,
            },
        ] = d.operators.as_slice()
        else {
            panic!("{:?}", d.operators)
        };
        assert_eq!((id.as_str(), alias.as_str()), ("filter-1", "r"));
        assert!(
            template.contains("at least one positive aspect"),
            "{template}"
        );
        assert!(template.contains("{0}"), "{template}");
        assert_eq!(d.select, [selected("r", "id", "r")]);
        assert_eq!(d.tree, PlanTree::Operator(0, vec![PlanTree::Scan(0)]));
    }

    #[test]
    fn stacked_filters_are_numbered_bottom_up() {
        let d = view("IMDB-6", &["r"]);
        assert_eq!(ids(&d), ["filter-1", "filter-2"]);
        assert_eq!(
            d.tree,
            PlanTree::Operator(1, vec![PlanTree::Operator(0, vec![PlanTree::Scan(0)])])
        );
    }

    #[test]
    fn a_join_plan_pairs_its_two_reads_in_placeholder_order() {
        let d = view("FEV-2", &["c", "e"]);
        assert_eq!(
            d.relations,
            [
                relation("c", "claims", ["id", "claim"]),
                relation("e", "evidence", ["id", "text"])
            ]
        );
        let [
            Operator::Join {
                id, aliases, on, ..
            },
        ] = d.operators.as_slice()
        else {
            panic!("{:?}", d.operators)
        };
        assert_eq!(id, "join-1");
        assert_eq!(aliases, &["c".to_string(), "e".to_string()]);
        assert!(on.is_empty());
        assert_eq!(
            d.tree,
            PlanTree::Operator(0, vec![PlanTree::Scan(0), PlanTree::Scan(1)])
        );
        assert_eq!(
            d.select,
            [selected("c", "id", "c"), selected("e", "id", "e")]
        );
    }

    #[test]
    fn a_classification_takes_its_label_column_name_from_the_projection() {
        let d = view("IMDB-11", &["r", "sentiment"]);
        let [
            Operator::Classify {
                id,
                alias,
                partner,
                labels,
                descriptions,
                output,
                ..
            },
        ] = d.operators.as_slice()
        else {
            panic!("{:?}", d.operators)
        };
        assert_eq!((id.as_str(), alias.as_str()), ("classify-1", "r"));
        assert_eq!(partner, &None);
        assert_eq!(labels, &["positive", "negative", "neutral", "mixed"]);
        assert_eq!(descriptions, &["", "", "", ""]);
        assert_eq!(output, "sentiment");
        assert_eq!(
            d.select,
            [
                selected("r", "id", "r"),
                selected("r", "sentiment", "sentiment")
            ]
        );
    }

    #[test]
    fn an_in_list_tests_a_label_and_a_joined_row_classification_has_a_partner() {
        let d = view("IMDB-15", &["r", "sentiment", "a", "aspect_sentiment"]);
        assert_eq!(ids(&d), ["classify-1", "in-list-1", "join-1", "classify-2"]);
        assert_eq!(
            d.operators[1],
            Operator::InList {
                id: "in-list-1".into(),
                alias: "r".into(),
                output: "sentiment".into(),
                accepted: vec!["negative".into(), "mixed".into()],
            }
        );
        let Operator::Classify {
            alias,
            partner,
            output,
            ..
        } = &d.operators[3]
        else {
            panic!("{:?}", d.operators[3])
        };
        assert_eq!(alias, "r");
        assert_eq!(partner.as_deref(), Some("a"));
        assert_eq!(output, "aspect_sentiment");
        use PlanTree::{Operator as Op, Scan};
        assert_eq!(
            d.tree,
            Op(
                3,
                vec![Op(2, vec![Op(1, vec![Op(0, vec![Scan(0)])]), Scan(1)])]
            )
        );
        assert_eq!(
            d.relations,
            [
                relation("r", "reviews", ["id", "body"]),
                relation("a", "aspects", ["id", "aspect"])
            ]
        );
    }

    #[test]
    fn plans_of_other_shapes_are_not_quailb() {
        let r = || read("reviews", "r", &["id", "body"]);
        let cases: Vec<(LogicalPlanBuilder, &str)> = vec![
            (
                scan("reviews", &["id", "body"]),
                "the read of reviews has no alias hint",
            ),
            (
                read("reviews", "r", &["body", "id"]),
                "the read of reviews must list `id` first",
            ),
            (
                r().cross_join(read("aspects", "a", &["id", "aspect"]).build().unwrap())
                    .unwrap(),
                "a join whose condition calls no ai_join is not part of a QUAIL-B plan",
            ),
            (
                r().aggregate(vec![col("r.body")], Vec::<Expr>::new())
                    .unwrap(),
                "is not part of a QUAIL-B plan (filters, joins, projections and reads only)",
            ),
            (
                r().filter(col("r.body").eq(lit("good"))).unwrap(),
                "is neither ai_filter nor an IN-list on a label column",
            ),
            (
                r().filter(col("r.body").in_list(vec![lit("good")], false))
                    .unwrap(),
                "in-list-1: r.body is not the label column of a classification",
            ),
            (
                r().project(vec![col("r.id")]).unwrap(),
                "relation r is read by no AI function",
            ),
        ];
        for (builder, message) in cases {
            let plan = builder.build().unwrap();
            match derive(&plan, &[], &[]) {
                Err(BenchError::NotQuailb(m)) => assert!(m.contains(message), "{m}"),
                Err(e) => panic!("{message}: not NotQuailb: {e}"),
                Ok(_) => panic!("{message}: derived\n{}", plan.display_indent()),
            }
        }
    }

    #[test]
    fn an_operator_id_hint_out_of_post_order_is_invalid() {
        let mut json = catalog_json("IMDB-6");
        json["relations"][0]["root"]["input"]["project"]["input"]["filter"]["common"]["hint"]["alias"] =
            serde_json::json!("filter-3");
        match view_of(json, &["r"]) {
            Err(BenchError::Engine(EngineError::InvalidPlan(m))) => assert!(
                m.contains(
                    "operator id \"filter-3\" breaks post-order numbering (expected \"filter-2\")"
                ),
                "{m}"
            ),
            Err(e) => panic!("not InvalidPlan: {e}"),
            Ok(d) => panic!("derived {:?}", d.operators),
        }
    }

    #[test]
    fn root_names_must_be_the_aliases_and_label_columns() {
        for (names, message) in [
            (
                &["review"][..],
                "root column \"review\" should be named \"r\" (SPEC §A.7)",
            ),
            (
                &["r", "extra"][..],
                "the root names 2 columns but selects 1",
            ),
        ] {
            match view_of(catalog_json("IMDB-1"), names) {
                Err(BenchError::Engine(EngineError::InvalidPlan(m))) => {
                    assert!(m.contains(message), "{m}")
                }
                Err(e) => panic!("not InvalidPlan: {e}"),
                Ok(d) => panic!("derived {:?}", d.select),
            }
        }
        // No names given: nothing to check them against.
        assert_eq!(view("IMDB-1", &[]).select, [selected("r", "id", "r")]);
    }
}
