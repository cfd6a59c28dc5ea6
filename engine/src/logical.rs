//! Substrait → DataFusion with first-class AI operators.
//!
//! Design: a custom [`SubstraitConsumer`] ([`AiConsumer`]) lets datafusion-substrait
//! build the relational plan, and intercepts exactly three relation shapes —
//! a filter whose condition calls `ai_filter`, a join whose condition contains
//! `ai_join` (possibly AND-ed with equalities), and a projection that adds one
//! `ai_classify` — turning each into an [`AiNode`] extension node. Nothing is
//! ever evaluated row by row as a scalar UDF inside a nested-loop join: the
//! physical planner ([`crate::physical`]) lowers each `AiNode` to an operator
//! that batches its prompts for the backend.
//!
//! Every scan is wrapped in a `SubqueryAlias` named by its Substrait alias hint,
//! so columns are qualified by alias (`r.body`, `a2.id`) — two scans of one
//! table stay distinct, and AI nodes find their id and text columns by name.
//! Operator ids come from the validated [`QueryPlan`], which numbers operators
//! in the same post-order the consumer visits them.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::catalog::TableProvider;
use datafusion::common::{Column, DFSchema, DFSchemaRef, TableReference};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::FunctionRegistry;
use datafusion::execution::SessionState;
use datafusion::logical_expr::{
    Expr, Extension, LogicalPlan, LogicalPlanBuilder, UserDefinedLogicalNodeCore,
};
use datafusion_substrait::extensions::Extensions;
use datafusion_substrait::logical_plan::consumer::{
    SubstraitConsumer, from_filter_rel, from_join_rel, from_project_rel, from_read_rel,
    from_substrait_plan_with_consumer,
};
use datafusion_substrait::substrait::proto::function_argument::ArgType;
use datafusion_substrait::substrait::proto::{
    Expression, FilterRel, JoinRel, ProjectRel, ReadRel, RelCommon, expression::RexType,
};

use crate::backend::{AiCall, AiKind};
use crate::plan::{Operator, QueryPlan};
use crate::prompt::{PromptFormat, operator_pieces};

/// Where one document of a prompt lives in an AI node's input row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DocSlot {
    /// Relation alias.
    pub alias: String,
    /// Index of `alias.id` in the node's input schema (left ‖ right for joins).
    pub id_index: usize,
    /// Index of the text column.
    pub text_index: usize,
}

/// Everything an AI operator needs at run time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AiSpec {
    /// The call as the backend sees it.
    pub call: AiCall,
    /// The `{0}` document and, for pairs, the `{1}` document.
    pub slots: Vec<DocSlot>,
    /// Join equalities as input-schema indices: ({0}-side column, {1}-side column).
    pub equalities: Vec<(usize, usize)>,
    /// Number of fields of the left input (joins); 0 otherwise.
    pub left_width: usize,
    /// Classification output column (bare name).
    pub output: Option<String>,
}

/// An AI operator in the logical plan: filter, join or classification.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AiNode {
    /// Run-time description.
    pub spec: AiSpec,
    /// One input (filter, classify) or two (join).
    pub inputs: Vec<LogicalPlan>,
    /// Output schema.
    pub schema: DFSchemaRef,
}

impl PartialOrd for AiNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.spec.partial_cmp(&other.spec)
    }
}

impl UserDefinedLogicalNodeCore for AiNode {
    fn name(&self) -> &str {
        match self.spec.call.kind {
            AiKind::Filter => "AiFilter",
            AiKind::Join => "AiJoin",
            AiKind::Classify => "AiClassify",
        }
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        self.inputs.iter().collect()
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        Vec::new()
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let docs: Vec<&str> = self.spec.slots.iter().map(|s| s.alias.as_str()).collect();
        write!(
            f,
            "{}: {} on {} prompt={:?}",
            self.name(),
            self.spec.call.op_id,
            docs.join(" × "),
            crate::prompt::shorten(&self.spec.call.template, 48)
        )?;
        if let Some(out) = &self.spec.output {
            write!(f, " -> {}.{out}", self.spec.slots[0].alias)?;
        }
        Ok(())
    }

    fn with_exprs_and_inputs(&self, exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> DfResult<Self> {
        if !exprs.is_empty() || inputs.len() != self.inputs.len() {
            return Err(DataFusionError::Internal(format!(
                "{} takes no expressions and {} inputs",
                self.spec.call.op_id,
                self.inputs.len()
            )));
        }
        Ok(Self {
            spec: self.spec.clone(),
            inputs,
            schema: self.schema.clone(),
        })
    }
}

/// The consumer that builds DataFusion plans with [`AiNode`]s.
pub struct AiConsumer<'a> {
    extensions: Extensions,
    state: &'a SessionState,
    query: &'a QueryPlan,
    format: PromptFormat,
    counters: Mutex<HashMap<&'static str, usize>>,
}

impl<'a> AiConsumer<'a> {
    /// A consumer for `query` over the tables registered in `state`.
    pub fn new(
        state: &'a SessionState,
        query: &'a QueryPlan,
        format: PromptFormat,
    ) -> DfResult<Self> {
        Ok(Self {
            extensions: Extensions::try_from(&query.substrait.extensions)?,
            state,
            query,
            format,
            counters: Mutex::new(HashMap::new()),
        })
    }

    /// Consumes the whole plan.
    pub async fn consume(&self) -> DfResult<LogicalPlan> {
        from_substrait_plan_with_consumer(self, &self.query.substrait).await
    }

    fn function_base(&self, e: &Expression) -> Option<&str> {
        match e.rex_type.as_ref()? {
            RexType::ScalarFunction(f) => self
                .extensions
                .functions
                .get(&f.function_reference)
                .map(|n| n.split(':').next().unwrap_or(n)),
            _ => None,
        }
    }

    fn contains_function(&self, e: &Expression, name: &str) -> bool {
        let Some(RexType::ScalarFunction(f)) = e.rex_type.as_ref() else {
            return false;
        };
        self.function_base(e) == Some(name)
            || f.arguments.iter().any(|a| match &a.arg_type {
                Some(ArgType::Value(v)) => self.contains_function(v, name),
                _ => false,
            })
    }

    /// The next operator of a kind, in post-order, from the validated query.
    fn next_operator(
        &self,
        prefix: &'static str,
        common: Option<&RelCommon>,
    ) -> DfResult<&'a Operator> {
        let n = {
            let mut c = self.counters.lock().expect("counter lock");
            let n = c.entry(prefix).or_insert(0);
            *n += 1;
            *n
        };
        let id = common
            .and_then(|c| c.hint.as_ref())
            .map(|h| h.alias.clone())
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| format!("{prefix}-{n}"));
        self.query.operator(&id).ok_or_else(|| {
            DataFusionError::Plan(format!(
                "operator {id} is missing from the query description"
            ))
        })
    }

    fn slot(&self, schema: &DFSchema, alias: &str) -> DfResult<DocSlot> {
        let relation = self
            .query
            .relation(alias)
            .ok_or_else(|| DataFusionError::Plan(format!("unknown alias {alias}")))?;
        let index = |column: &str| {
            schema
                .index_of_column(&Column::new(Some(TableReference::bare(alias)), column))
                .map_err(|_| {
                    DataFusionError::Plan(format!(
                        "column {alias}.{column} is not in the input of the AI operator"
                    ))
                })
        };
        Ok(DocSlot {
            alias: alias.to_string(),
            id_index: index("id")?,
            text_index: index(&relation.text_column)?,
        })
    }

    fn call(&self, op: &Operator, kind: AiKind, aliases: &[&str]) -> DfResult<AiCall> {
        let pieces = operator_pieces(self.format, op)
            .map_err(DataFusionError::from)?
            .expect("AI operators have prompt pieces");
        let mut tables = Vec::new();
        let mut columns = Vec::new();
        for a in aliases {
            let r = self.query.relation(a).expect("validated alias");
            tables.push(r.table.clone());
            columns.push(r.text_column.clone());
        }
        let labels = match op {
            Operator::Classify { labels, .. } => labels.clone(),
            _ => Vec::new(),
        };
        Ok(AiCall {
            op_id: op.id().to_string(),
            kind,
            template: op.template().unwrap_or_default().to_string(),
            tables,
            columns,
            pieces,
            labels,
        })
    }
}

fn ai_plan(node: AiNode) -> LogicalPlan {
    LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    })
}

#[async_trait]
impl SubstraitConsumer for AiConsumer<'_> {
    async fn resolve_table_ref(
        &self,
        table_ref: &TableReference,
    ) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let table = table_ref.table().to_string();
        let schema = self.state.schema_for_ref(table_ref.clone())?;
        schema.table(&table).await
    }

    fn get_extensions(&self) -> &Extensions {
        &self.extensions
    }

    fn get_function_registry(&self) -> &impl FunctionRegistry {
        self.state
    }

    async fn consume_read(&self, rel: &ReadRel) -> DfResult<LogicalPlan> {
        let plan = from_read_rel(self, rel).await?;
        let alias = rel
            .common
            .as_ref()
            .and_then(|c| c.hint.as_ref())
            .map(|h| h.alias.clone())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| DataFusionError::Plan("a read has no alias hint".into()))?;
        LogicalPlanBuilder::from(plan).alias(alias)?.build()
    }

    async fn consume_filter(&self, rel: &FilterRel) -> DfResult<LogicalPlan> {
        let is_ai = rel
            .condition
            .as_deref()
            .is_some_and(|c| self.function_base(c) == Some("ai_filter"));
        if !is_ai {
            return from_filter_rel(self, rel).await;
        }
        let input = self
            .consume_rel(
                rel.input
                    .as_deref()
                    .ok_or_else(|| DataFusionError::Plan("filter without input".into()))?,
            )
            .await?;
        let op = self.next_operator("filter", rel.common.as_ref())?;
        let Operator::Filter { alias, .. } = op else {
            return Err(DataFusionError::Plan(format!(
                "{} is not a filter",
                op.id()
            )));
        };
        let spec = AiSpec {
            call: self.call(op, AiKind::Filter, &[alias])?,
            slots: vec![self.slot(input.schema(), alias)?],
            equalities: Vec::new(),
            left_width: 0,
            output: None,
        };
        let schema = input.schema().clone();
        Ok(ai_plan(AiNode {
            spec,
            inputs: vec![input],
            schema,
        }))
    }

    async fn consume_join(&self, rel: &JoinRel) -> DfResult<LogicalPlan> {
        let is_ai = rel
            .expression
            .as_deref()
            .is_some_and(|c| self.contains_function(c, "ai_join"));
        if !is_ai {
            return from_join_rel(self, rel).await;
        }
        let missing = || DataFusionError::Plan("join without both inputs".into());
        let left = self
            .consume_rel(rel.left.as_deref().ok_or_else(missing)?)
            .await?;
        let right = self
            .consume_rel(rel.right.as_deref().ok_or_else(missing)?)
            .await?;
        let op = self.next_operator("join", rel.common.as_ref())?;
        let Operator::Join { aliases, on, .. } = op else {
            return Err(DataFusionError::Plan(format!("{} is not a join", op.id())));
        };
        let schema = Arc::new(left.schema().join(right.schema())?);
        let col = |alias: &str, column: &str| {
            schema
                .index_of_column(&Column::new(Some(TableReference::bare(alias)), column))
                .map_err(|_| {
                    DataFusionError::Plan(format!("{}: no column {alias}.{column}", op.id()))
                })
        };
        let equalities = on
            .iter()
            .map(|(c0, c1)| Ok((col(&aliases[0], c0)?, col(&aliases[1], c1)?)))
            .collect::<DfResult<Vec<_>>>()?;
        let spec = AiSpec {
            call: self.call(op, AiKind::Join, &[&aliases[0], &aliases[1]])?,
            slots: vec![
                self.slot(&schema, &aliases[0])?,
                self.slot(&schema, &aliases[1])?,
            ],
            equalities,
            left_width: left.schema().fields().len(),
            output: None,
        };
        Ok(ai_plan(AiNode {
            spec,
            inputs: vec![left, right],
            schema,
        }))
    }

    async fn consume_project(&self, rel: &ProjectRel) -> DfResult<LogicalPlan> {
        let is_ai = rel.expressions.len() == 1
            && self.function_base(&rel.expressions[0]) == Some("ai_classify");
        if !is_ai {
            return from_project_rel(self, rel).await;
        }
        let input = self
            .consume_rel(
                rel.input
                    .as_deref()
                    .ok_or_else(|| DataFusionError::Plan("projection without input".into()))?,
            )
            .await?;
        let op = self.next_operator("classify", rel.common.as_ref())?;
        let Operator::Classify {
            alias,
            partner,
            output,
            ..
        } = op
        else {
            return Err(DataFusionError::Plan(format!(
                "{} is not a classification",
                op.id()
            )));
        };
        let mut aliases = vec![alias.as_str()];
        aliases.extend(partner.as_deref());
        let slots = aliases
            .iter()
            .map(|a| self.slot(input.schema(), a))
            .collect::<DfResult<Vec<_>>>()?;
        let mut fields: Vec<(Option<TableReference>, Arc<Field>)> = input
            .schema()
            .iter()
            .map(|(q, f)| (q.cloned(), f.clone()))
            .collect();
        fields.push((
            Some(TableReference::bare(alias.as_str())),
            Arc::new(Field::new(output, DataType::Utf8, false)),
        ));
        let schema = Arc::new(DFSchema::new_with_metadata(fields, HashMap::new())?);
        let spec = AiSpec {
            call: self.call(op, AiKind::Classify, &aliases)?,
            slots,
            equalities: Vec::new(),
            left_width: 0,
            output: Some(output.clone()),
        };
        Ok(ai_plan(AiNode {
            spec,
            inputs: vec![input],
            schema,
        }))
    }
}
