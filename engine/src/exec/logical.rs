//! The AI operators of the logical plan ([`AiNode`]: filter, join, appended
//! value or label).
//!
//! Nodes are made by one analyzer rule ([`crate::sql::rewrite`]) from the AI
//! function calls of any plan — SQL, QUAIL-B Substrait, any producer's
//! Substrait — and lowered by [`crate::exec::physical`] to operators that batch their
//! prompts. Nothing is ever evaluated row by row as a scalar function inside a
//! nested-loop join.
//!
//! A node names its columns (document id and text, join keys) rather than
//! indexing them, so DataFusion's optimizer may prune and reorder its inputs;
//! it tells the optimizer which predicates may pass it
//! (`prevent_predicate_push_down_columns`) and which input columns it needs
//! (`necessary_children_exprs`).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Column, DFSchema, DFSchemaRef, JoinType, TableReference};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore, build_join_schema};

use crate::inference::backend::AiCall;

/// One document of a prompt: the columns holding its id and its text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct DocRef {
    /// The relation it comes from, as answer tables name it (`r1`, `reviews`).
    pub alias: String,
    /// Its row id (the text column itself when the relation has no `id`).
    pub id: Column,
    /// The text the prompt embeds.
    pub text: Column,
}

/// What an AI operator does with its answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum AiShape {
    /// Keeps the rows answered TRUE (one input, schema unchanged).
    Filter,
    /// Pairs two inputs on the answer, with the join's type.
    Join(JoinType),
    /// Appends the answer as a column: a label, or an AI predicate's value used
    /// inside a larger expression (`CASE`, `OR`, `SUM`).
    Project,
    /// Appends one answer per row over the row's list of texts: an `ai_agg`
    /// over a group's rows ([`crate::exec::ai_aggregate`]).
    Aggregate,
}

/// Everything an AI operator needs at run time. Columns are named, not indexed,
/// so the optimizer may prune or reorder the inputs' columns.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct AiSpec {
    /// The call as the backend sees it.
    pub call: AiCall,
    /// What happens to the answers.
    pub shape: AiShape,
    /// The `{0}` document and, for pairs, the `{1}` document.
    pub docs: Vec<DocRef>,
    /// Join equalities: ({0}-side column, {1}-side column). Only pairs meeting
    /// them are asked.
    pub equalities: Vec<(Column, Column)>,
    /// The appended column ([`AiShape::Project`]).
    pub output: Option<Column>,
    /// Join conditions besides the equalities and the AI call, over both
    /// inputs: a pair failing them is never asked.
    pub residual: Option<Expr>,
    /// The prompt pieces of an `ai_agg`'s combining rounds
    /// ([`AiShape::Aggregate`]; `call.pieces` are its first round's).
    pub combine: Option<crate::inference::prompt::PromptPieces>,
}

impl AiSpec {
    /// The columns the operator reads, in the order [`AiNode::expressions`] lists
    /// them (ids, texts, then equality columns; the residual follows them).
    fn columns(&self) -> Vec<Column> {
        let mut c: Vec<Column> = self.docs.iter().map(|d| d.id.clone()).collect();
        c.extend(self.docs.iter().map(|d| d.text.clone()));
        for (a, b) in &self.equalities {
            c.push(a.clone());
            c.push(b.clone());
        }
        c
    }

    /// The same spec reading `columns` (as [`Self::columns`] orders them).
    fn with_columns(&self, columns: Vec<Column>) -> DfResult<Self> {
        if columns.len() != self.columns().len() {
            return Err(DataFusionError::Internal(format!(
                "{}: expected {} columns, got {}",
                self.call.op_id,
                self.columns().len(),
                columns.len()
            )));
        }
        let n = self.docs.len();
        let mut spec = self.clone();
        for (i, d) in spec.docs.iter_mut().enumerate() {
            d.id = columns[i].clone();
            d.text = columns[n + i].clone();
        }
        for (i, e) in spec.equalities.iter_mut().enumerate() {
            *e = (
                columns[2 * n + 2 * i].clone(),
                columns[2 * n + 2 * i + 1].clone(),
            );
        }
        Ok(spec)
    }

    /// Rough prompt tokens of the fixed text (a token is about four bytes of
    /// English): what `EXPLAIN` shows and what orders a relation's AI filters.
    pub fn estimated_prompt_tokens(&self) -> usize {
        self.call.pieces.fixed_len().div_ceil(4)
    }
}

/// An AI operator in the logical plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AiNode {
    /// Run-time description.
    pub spec: AiSpec,
    /// One input (filter, projection) or two (join).
    pub inputs: Vec<LogicalPlan>,
    /// Output schema.
    pub schema: DFSchemaRef,
}

impl PartialOrd for AiNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.spec.partial_cmp(&other.spec)
    }
}

/// Checks that `document`, of type `t`, is text an AI call can read; the error
/// says how to make it so.
pub fn check_text(document: &impl fmt::Display, t: &DataType) -> Result<(), String> {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Ok(()),
        other => Err(format!(
            "the document {document} is {other}, not text; cast it (CAST({document} AS VARCHAR))"
        )),
    }
}

impl AiNode {
    /// The schema the node's columns are named in: its input, or left ‖ right
    /// for a join.
    pub fn input_schema(shape: AiShape, inputs: &[LogicalPlan]) -> DfResult<DFSchemaRef> {
        Ok(match shape {
            AiShape::Join(_) => Arc::new(inputs[0].schema().join(inputs[1].schema())?),
            _ => inputs[0].schema().clone(),
        })
    }

    /// Checks `spec` against `inputs` and derives the output schema.
    pub fn try_new(spec: AiSpec, inputs: Vec<LogicalPlan>) -> DfResult<Self> {
        let op = spec.call.op_id.clone();
        let want = match spec.shape {
            AiShape::Join(_) => 2,
            _ => 1,
        };
        if inputs.len() != want {
            return Err(DataFusionError::Internal(format!(
                "{op} takes {want} input(s), got {}",
                inputs.len()
            )));
        }
        let combined = Self::input_schema(spec.shape, &inputs)?;
        for d in &spec.docs {
            combined.index_of_column(&d.id).map_err(|_| {
                DataFusionError::Plan(format!("{op}: no column {} for the document id", d.id))
            })?;
            let (_, field) = combined.qualified_field_from_column(&d.text).map_err(|_| {
                DataFusionError::Plan(format!("{op}: no column {} for the document", d.text))
            })?;
            let checked = match (spec.shape, field.data_type()) {
                (AiShape::Aggregate, DataType::List(item)) => check_text(&d.text, item.data_type()),
                (_, t) => check_text(&d.text, t),
            };
            checked.map_err(|m| DataFusionError::Plan(format!("{op}: {m}")))?;
        }
        let schema = match spec.shape {
            AiShape::Filter => combined,
            AiShape::Join(t) => Arc::new(build_join_schema(
                inputs[0].schema(),
                inputs[1].schema(),
                &t,
            )?),
            AiShape::Project | AiShape::Aggregate => {
                let out = spec.output.as_ref().ok_or_else(|| {
                    DataFusionError::Internal(format!("{op} appends a column but names none"))
                })?;
                let data_type = spec.call.return_type();
                let mut fields: Vec<(Option<TableReference>, Arc<Field>)> = combined
                    .iter()
                    .map(|(q, f)| (q.cloned(), f.clone()))
                    .collect();
                fields.push((
                    out.relation.clone(),
                    Arc::new(Field::new(&out.name, data_type, true)),
                ));
                Arc::new(DFSchema::new_with_metadata(fields, HashMap::new())?)
            }
        };
        Ok(Self {
            spec,
            inputs,
            schema,
        })
    }
}

impl UserDefinedLogicalNodeCore for AiNode {
    fn name(&self) -> &str {
        match (self.spec.shape, self.spec.call.kind) {
            (AiShape::Filter, _) => "AiFilter",
            (AiShape::Join(_), _) => "AiJoin",
            (AiShape::Project, kind) => kind.describe().projection_node(),
            (AiShape::Aggregate, _) => "AiAgg",
        }
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        self.inputs.iter().collect()
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        let mut exprs: Vec<Expr> = self.spec.columns().into_iter().map(Expr::Column).collect();
        exprs.extend(self.spec.residual.clone());
        exprs
    }

    fn prevent_predicate_push_down_columns(&self) -> HashSet<String> {
        match self.spec.shape {
            // Rows pass unchanged: an ordinary predicate above runs first, below.
            AiShape::Filter => HashSet::new(),
            AiShape::Project | AiShape::Aggregate => {
                self.spec.output.iter().map(|c| c.name.clone()).collect()
            }
            // DataFusion would push a predicate into both inputs of a two-input
            // node; the AI rewrite places a join's predicates itself.
            AiShape::Join(_) => self
                .schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect(),
        }
    }

    fn necessary_children_exprs(&self, output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        match self.spec.shape {
            AiShape::Filter => Some(vec![output_columns.to_vec()]),
            AiShape::Project | AiShape::Aggregate => {
                let width = self.inputs[0].schema().fields().len();
                Some(vec![
                    output_columns
                        .iter()
                        .copied()
                        .filter(|&i| i < width)
                        .collect(),
                ])
            }
            AiShape::Join(t) => {
                let lw = self.inputs[0].schema().fields().len();
                let (left, right): (Vec<usize>, Vec<usize>) = match t {
                    JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => (
                        output_columns.iter().copied().filter(|&i| i < lw).collect(),
                        vec![],
                    ),
                    JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => {
                        (vec![], output_columns.to_vec())
                    }
                    _ => (
                        output_columns.iter().copied().filter(|&i| i < lw).collect(),
                        output_columns
                            .iter()
                            .filter(|&&i| i >= lw)
                            .map(|&i| i - lw)
                            .collect(),
                    ),
                };
                Some(vec![left, right])
            }
        }
    }

    fn supports_limit_pushdown(&self) -> bool {
        // One row out per row in: a LIMIT above may stop the input early.
        self.spec.shape == AiShape::Project
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let docs: Vec<String> = self.spec.docs.iter().map(|d| d.text.to_string()).collect();
        write!(
            f,
            "{}: {} on {} prompt={:?} prompt_tokens≈{}+documents",
            self.name(),
            self.spec.call.op_id,
            docs.join(" × "),
            crate::inference::prompt::shorten(&self.spec.call.template, 48),
            self.spec.estimated_prompt_tokens(),
        )?;
        if let AiShape::Join(t) = self.spec.shape {
            write!(f, " type={t}")?;
            if !self.spec.equalities.is_empty() {
                let eq: Vec<String> = self
                    .spec
                    .equalities
                    .iter()
                    .map(|(a, b)| format!("{a} = {b}"))
                    .collect();
                write!(f, " on {}", eq.join(" AND "))?;
            }
            if let Some(r) = &self.spec.residual {
                write!(f, " filter={r}")?;
            }
        }
        if !self.spec.call.labels.is_empty() {
            write!(f, " labels={:?}", self.spec.call.shown_labels())?;
        }
        if self.spec.call.kind.generates() {
            write!(f, " max_tokens={}", self.spec.call.max_tokens)?;
        }
        if let Some(out) = &self.spec.output {
            write!(f, " -> {out}")?;
        }
        Ok(())
    }

    fn with_exprs_and_inputs(
        &self,
        mut exprs: Vec<Expr>,
        inputs: Vec<LogicalPlan>,
    ) -> DfResult<Self> {
        let residual = if self.spec.residual.is_some() {
            exprs.pop()
        } else {
            None
        };
        let columns = exprs
            .into_iter()
            .map(|e| match e {
                Expr::Column(c) => Ok(c),
                other => Err(DataFusionError::Internal(format!(
                    "{} reads columns, not {other}",
                    self.spec.call.op_id
                ))),
            })
            .collect::<DfResult<Vec<_>>>()?;
        let mut spec = self.spec.with_columns(columns)?;
        spec.residual = residual;
        Self::try_new(spec, inputs)
    }
}

/// The AI nodes of a plan, in post-order (inputs before the nodes above them):
/// the order their operator ids number them in.
pub fn ai_nodes(plan: &LogicalPlan) -> Vec<AiNode> {
    fn walk(plan: &LogicalPlan, nodes: &mut Vec<AiNode>) {
        for input in plan.inputs() {
            walk(input, nodes);
        }
        // Subqueries left in expressions (an uncorrelated scalar subquery) run
        // before the operator that reads them.
        let _ = plan.apply_subqueries(|sub| {
            walk(sub, nodes);
            Ok(TreeNodeRecursion::Jump)
        });
        if let LogicalPlan::Extension(e) = plan
            && let Some(n) = e.node.as_any().downcast_ref::<AiNode>()
        {
            nodes.push(n.clone());
        }
    }
    let mut nodes = Vec::new();
    walk(plan, &mut nodes);
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{DefaultHasher, Hash, Hasher};

    use datafusion::arrow::datatypes::Schema;
    use datafusion::logical_expr::{Extension, table_scan};

    use crate::inference::backend::{AiKind, test_call};

    /// An empty read of `table` with `fields`.
    fn scan(table: &str, fields: Vec<Field>) -> LogicalPlan {
        table_scan(Some(table), &Schema::new(fields), None)
            .unwrap()
            .build()
            .unwrap()
    }

    /// `table(id BIGINT NOT NULL, text VARCHAR)`.
    fn docs_table(table: &str) -> LogicalPlan {
        scan(
            table,
            vec![
                Field::new("id", DataType::Int64, false),
                Field::new("text", DataType::Utf8, true),
            ],
        )
    }

    fn col(table: &str, name: &str) -> Column {
        Column::new(Some(table), name)
    }

    fn doc(table: &str) -> DocRef {
        DocRef {
            alias: table.into(),
            id: col(table, "id"),
            text: col(table, "text"),
        }
    }

    /// A spec of `shape` asking `kind` about `docs` (op id `op-1`).
    fn spec(kind: AiKind, shape: AiShape, docs: Vec<DocRef>) -> AiSpec {
        let (template, labels): (&str, &[&str]) = match kind {
            AiKind::Join => ("Does {0} cite {1}?", &[]),
            AiKind::Classify => ("Tone of {0}?", &["good", "bad"]),
            AiKind::Score => ("Rate {0}.", &[]),
            AiKind::Complete => ("Summarise {0}.", &[]),
            _ => ("Is {0} kind?", &[]),
        };
        AiSpec {
            call: test_call(kind, template, labels),
            shape,
            docs,
            equalities: Vec::new(),
            output: None,
            residual: None,
            combine: None,
        }
    }

    fn appending(mut spec: AiSpec) -> AiSpec {
        spec.output = Some(Column::new_unqualified("__ai_1"));
        spec
    }

    fn names(schema: &DFSchema) -> Vec<String> {
        schema.columns().iter().map(|c| c.flat_name()).collect()
    }

    fn explain(node: AiNode) -> String {
        let plan = LogicalPlan::Extension(Extension {
            node: Arc::new(node),
        });
        plan.display().to_string()
    }

    fn hash(node: &AiNode) -> u64 {
        let mut h = DefaultHasher::new();
        node.hash(&mut h);
        h.finish()
    }

    #[test]
    fn a_filter_passes_its_input_schema_and_every_predicate() {
        let node = AiNode::try_new(
            spec(AiKind::Filter, AiShape::Filter, vec![doc("t")]),
            vec![docs_table("t")],
        )
        .unwrap();
        assert_eq!(node.name(), "AiFilter");
        assert_eq!(node.schema, docs_table("t").schema().clone());
        assert!(node.prevent_predicate_push_down_columns().is_empty());
        assert_eq!(node.necessary_children_exprs(&[1]), Some(vec![vec![1]]));
        assert!(!node.supports_limit_pushdown());
    }

    #[test]
    fn a_project_appends_a_column_of_its_answer_type_named_by_kind() {
        for (kind, name, data_type) in [
            (AiKind::Classify, "AiClassify", DataType::Utf8),
            (AiKind::Score, "AiScore", DataType::Float64),
            (AiKind::Complete, "AiComplete", DataType::Utf8),
            (AiKind::Filter, "AiPredicate", DataType::Boolean),
        ] {
            let s = appending(spec(kind, AiShape::Project, vec![doc("t")]));
            let node = AiNode::try_new(s, vec![docs_table("t")]).unwrap();
            assert_eq!(node.name(), name);
            assert_eq!(names(&node.schema), ["t.id", "t.text", "__ai_1"]);
            assert_eq!(node.schema.field(2).data_type(), &data_type, "{name}");
            // A predicate on the answer must stay above; the input needs only
            // its own columns; a LIMIT may pass (one row out per row in).
            assert_eq!(
                node.prevent_predicate_push_down_columns(),
                HashSet::from(["__ai_1".to_string()])
            );
            assert_eq!(node.necessary_children_exprs(&[0, 2]), Some(vec![vec![0]]));
            assert!(node.supports_limit_pushdown());
        }
        let e = AiNode::try_new(
            spec(AiKind::Classify, AiShape::Project, vec![doc("t")]),
            vec![docs_table("t")],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("op-1 appends a column but names none"), "{e}");
    }

    #[test]
    fn a_join_schema_and_needed_columns_follow_its_type() {
        let pair = || vec![doc("t"), doc("u")];
        let inputs = || vec![docs_table("t"), docs_table("u")];
        let inner = AiNode::try_new(
            spec(AiKind::Join, AiShape::Join(JoinType::Inner), pair()),
            inputs(),
        )
        .unwrap();
        assert_eq!(inner.name(), "AiJoin");
        assert_eq!(names(&inner.schema), ["t.id", "t.text", "u.id", "u.text"]);
        assert_eq!(
            inner.necessary_children_exprs(&[0, 3]),
            Some(vec![vec![0], vec![1]])
        );
        // No predicate is pushed through a two-input node by DataFusion.
        assert_eq!(
            inner.prevent_predicate_push_down_columns(),
            HashSet::from(["id".to_string(), "text".to_string()])
        );

        let left = AiNode::try_new(
            spec(AiKind::Join, AiShape::Join(JoinType::Left), pair()),
            inputs(),
        )
        .unwrap();
        assert!(!left.schema.field(0).is_nullable());
        assert!(left.schema.field(2).is_nullable(), "u.id is NULL-padded");

        let semi = AiNode::try_new(
            spec(AiKind::Join, AiShape::Join(JoinType::LeftSemi), pair()),
            inputs(),
        )
        .unwrap();
        assert_eq!(names(&semi.schema), ["t.id", "t.text"]);
        assert_eq!(
            semi.necessary_children_exprs(&[1]),
            Some(vec![vec![1], vec![]])
        );
    }

    #[test]
    fn an_aggregate_reads_a_list_of_texts() {
        let list = |item: DataType| {
            scan(
                "g",
                vec![
                    Field::new("n", DataType::Int64, true),
                    Field::new("texts", DataType::new_list(item, true), true),
                ],
            )
        };
        let texts = DocRef {
            alias: "g".into(),
            id: col("g", "texts"),
            text: col("g", "texts"),
        };
        let s = appending(spec(AiKind::Complete, AiShape::Aggregate, vec![texts]));
        let node = AiNode::try_new(s.clone(), vec![list(DataType::Utf8)]).unwrap();
        assert_eq!(node.name(), "AiAgg");
        assert_eq!(names(&node.schema), ["g.n", "g.texts", "__ai_1"]);
        assert_eq!(node.schema.field(2).data_type(), &DataType::Utf8);

        let e = AiNode::try_new(s.clone(), vec![list(DataType::Int64)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("op-1: the document g.texts is Int64, not text"),
            "{e}"
        );
        // Only an aggregate reads a list: a projection's document is one text.
        let project = AiSpec {
            shape: AiShape::Project,
            ..s
        };
        let e = AiNode::try_new(project, vec![list(DataType::Utf8)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the document g.texts is List") && e.contains("not text"),
            "{e}"
        );
    }

    #[test]
    fn try_new_checks_inputs_and_document_columns() {
        let join = spec(
            AiKind::Join,
            AiShape::Join(JoinType::Inner),
            vec![doc("t"), doc("u")],
        );
        let e = AiNode::try_new(join, vec![docs_table("t")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("op-1 takes 2 input(s), got 1"), "{e}");

        let filter = |d: DocRef| {
            AiNode::try_new(
                spec(AiKind::Filter, AiShape::Filter, vec![d]),
                vec![docs_table("t")],
            )
            .unwrap_err()
            .to_string()
        };
        let e = filter(DocRef {
            text: col("t", "body"),
            ..doc("t")
        });
        assert!(e.contains("op-1: no column t.body for the document"), "{e}");
        let e = filter(DocRef {
            id: col("u", "id"),
            ..doc("t")
        });
        assert!(
            e.contains("op-1: no column u.id for the document id"),
            "{e}"
        );
        let e = filter(DocRef {
            text: col("t", "id"),
            ..doc("t")
        });
        assert!(
            e.contains("the document t.id is Int64, not text; cast it (CAST(t.id AS VARCHAR))"),
            "{e}"
        );
    }

    #[test]
    fn check_text_accepts_the_string_types_only() {
        for t in [DataType::Utf8, DataType::LargeUtf8, DataType::Utf8View] {
            assert_eq!(check_text(&"r.body", &t), Ok(()));
        }
        assert_eq!(
            check_text(&"r.stars", &DataType::Int32),
            Err(
                "the document r.stars is Int32, not text; cast it (CAST(r.stars AS VARCHAR))"
                    .into()
            )
        );
    }

    /// An inner AI join of `t` and `u` keyed by `t.id = u.id`, residual `t.id < u.id`.
    fn keyed_join() -> AiNode {
        let mut s = spec(
            AiKind::Join,
            AiShape::Join(JoinType::Inner),
            vec![doc("t"), doc("u")],
        );
        s.equalities = vec![(col("t", "id"), col("u", "id"))];
        s.residual = Some(Expr::Column(col("t", "id")).lt(Expr::Column(col("u", "id"))));
        AiNode::try_new(s, vec![docs_table("t"), docs_table("u")]).unwrap()
    }

    #[test]
    fn expressions_are_ids_texts_equalities_then_the_residual() {
        let node = keyed_join();
        let c = |t, n| Expr::Column(col(t, n));
        assert_eq!(
            node.expressions(),
            vec![
                c("t", "id"),
                c("u", "id"),
                c("t", "text"),
                c("u", "text"),
                c("t", "id"),
                c("u", "id"),
                c("t", "id").lt(c("u", "id")),
            ]
        );
    }

    #[test]
    fn with_exprs_and_inputs_round_trips_and_renames_columns() {
        let node = keyed_join();
        let inputs = || vec![docs_table("t"), docs_table("u")];
        let same = node
            .with_exprs_and_inputs(node.expressions(), inputs())
            .unwrap();
        assert_eq!(same, node);

        // The optimizer may hand the node other columns: it reads them.
        let wide = scan(
            "t",
            vec![
                Field::new("id", DataType::Int64, false),
                Field::new("text", DataType::Utf8, true),
                Field::new("title", DataType::Utf8, true),
            ],
        );
        let mut exprs = node.expressions();
        exprs[2] = Expr::Column(col("t", "title"));
        let renamed = node
            .with_exprs_and_inputs(exprs, vec![wide, docs_table("u")])
            .unwrap();
        assert_eq!(renamed.spec.docs[0].text, col("t", "title"));
        assert_eq!(renamed.spec.docs[1], doc("u"));
        assert_eq!(renamed.spec.residual, node.spec.residual);

        // Too few columns, or an expression that is not a column: errors.
        let filter = AiNode::try_new(
            spec(AiKind::Filter, AiShape::Filter, vec![doc("t")]),
            vec![docs_table("t")],
        )
        .unwrap();
        let e = filter
            .with_exprs_and_inputs(vec![Expr::Column(col("t", "id"))], vec![docs_table("t")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("op-1: expected 2 columns, got 1"), "{e}");
        let e = filter
            .with_exprs_and_inputs(
                vec![
                    Expr::Column(col("t", "id")),
                    Expr::Column(col("t", "text")).is_null(),
                ],
                vec![docs_table("t")],
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("op-1 reads columns, not t.text IS NULL"), "{e}");
    }

    #[test]
    fn nodes_of_one_spec_and_inputs_are_equal_and_hash_alike() {
        let a = keyed_join();
        let b = keyed_join();
        assert_eq!(a, b);
        assert_eq!(hash(&a), hash(&b));
        assert_eq!(a.partial_cmp(&b), Some(std::cmp::Ordering::Equal));

        let mut s = a.spec.clone();
        s.call.op_id = "join-2".into();
        let c = AiNode::try_new(s, a.inputs.clone()).unwrap();
        assert_ne!(a, c);
        assert_ne!(hash(&a), hash(&c));
        let mut s = a.spec.clone();
        s.residual = None;
        assert_ne!(a, AiNode::try_new(s, a.inputs.clone()).unwrap());
    }

    #[test]
    fn explain_shows_kind_id_documents_prompt_and_join_details() {
        let join = keyed_join();
        let tokens = join.spec.estimated_prompt_tokens();
        assert!(tokens > 0);
        assert_eq!(
            explain(join),
            format!(
                "AiJoin: op-1 on t.text × u.text prompt=\"Does {{0}} cite {{1}}?\" \
                 prompt_tokens≈{tokens}+documents type=Inner on t.id = u.id filter=t.id < u.id"
            )
        );

        let classify = AiNode::try_new(
            appending(spec(AiKind::Classify, AiShape::Project, vec![doc("t")])),
            vec![docs_table("t")],
        )
        .unwrap();
        let text = explain(classify);
        assert!(
            text.starts_with("AiClassify: op-1 on t.text prompt=\"Tone of {0}?\""),
            "{text}"
        );
        assert!(
            text.ends_with(" labels=[\"good\", \"bad\"] -> __ai_1"),
            "{text}"
        );

        let complete = AiNode::try_new(
            appending(spec(AiKind::Complete, AiShape::Project, vec![doc("t")])),
            vec![docs_table("t")],
        )
        .unwrap();
        let text = explain(complete);
        assert!(text.ends_with(" max_tokens=16 -> __ai_1"), "{text}");
    }

    #[test]
    fn ai_nodes_lists_inputs_before_the_nodes_above_them() {
        let mut join = spec(
            AiKind::Join,
            AiShape::Join(JoinType::Inner),
            vec![doc("t"), doc("u")],
        );
        join.call.op_id = "join-1".into();
        let join = AiNode::try_new(join, vec![docs_table("t"), docs_table("u")]).unwrap();
        let mut filter = spec(AiKind::Filter, AiShape::Filter, vec![doc("u")]);
        filter.call.op_id = "filter-1".into();
        let below = LogicalPlan::Extension(Extension {
            node: Arc::new(join),
        });
        let filter = AiNode::try_new(filter, vec![below]).unwrap();
        let plan = LogicalPlan::Extension(Extension {
            node: Arc::new(filter),
        });
        let ids: Vec<String> = ai_nodes(&plan)
            .into_iter()
            .map(|n| n.spec.call.op_id)
            .collect();
        assert_eq!(ids, ["join-1", "filter-1"]);
    }
}
