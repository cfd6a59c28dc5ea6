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

use crate::inference::backend::{AiCall, AiKind};

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
            (AiShape::Project, AiKind::Classify) => "AiClassify",
            (AiShape::Project, AiKind::Score) => "AiScore",
            (AiShape::Project, AiKind::ClassifyScores) => "AiClassifyScores",
            (AiShape::Project, AiKind::Complete) => "AiComplete",
            (AiShape::Project, AiKind::Extract) => "AiExtract",
            (AiShape::Project, _) => "AiPredicate",
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
            write!(f, " labels={:?}", self.spec.call.labels)?;
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
