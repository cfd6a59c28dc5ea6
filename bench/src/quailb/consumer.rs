//! The Substrait consumer of QUAIL-B plans (SPEC §A): DataFusion's own, with
//! the benchmark's conventions (alias hints, output names, operator id hints)
//! over the empty tables the reads declare, so a plan is planned once, without
//! data, and a run gives its scans the data ([`crate::quailb::query`]).

use std::sync::{Arc, Mutex};

use crate::error::{BenchError, Result};
use aisql_engine::sql::SqlSession;
use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::TableProvider;
use datafusion::catalog::empty::EmptyTable;
use datafusion::common::{DFSchema, TableReference, plan_err};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::FunctionRegistry;
use datafusion::execution::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, Projection};
use datafusion_substrait::extensions::Extensions;
use datafusion_substrait::logical_plan::consumer::{
    SubstraitConsumer, from_filter_rel, from_join_rel, from_project_rel, from_scalar_function,
    from_substrait_named_struct,
};
use datafusion_substrait::substrait::proto::expression::{FieldReference, ScalarFunction};
use datafusion_substrait::substrait::proto::read_rel::ReadType;
use datafusion_substrait::substrait::proto::{
    FilterRel, JoinRel, Plan, ProjectRel, ReadRel, Rel, RelCommon,
};

/// A relation of a QUAIL-B plan that carries an operator (filter, join or
/// projection), with the operator id its hint gives, in post-order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorHint {
    /// `filter`, `join` or `project`.
    pub relation: &'static str,
    /// `common.hint.alias` (`filter-1`, `in-list-1`, ...), when given.
    pub id: Option<String>,
}

/// The Substrait consumer for QUAIL-B plans: DataFusion's own, except that
///
/// - every scan is wrapped in a `SubqueryAlias` named by its alias hint, so two
///   scans of one table stay distinct and answer tables name relations as the
///   plan does (`r1`, `a2`);
/// - a projection's `output_names` hint names its columns, so a label column is
///   `r.sentiment` in DataFusion's plan as in the QUAIL-B plan;
/// - the operator id hints of filters, joins and projections are kept, in
///   post-order ([`Self::hints`]).
///
/// - each table a read names is an empty table of the columns the reads
///   declare, its strings `Utf8View` (as a run serves them, so joins copy
///   views, not documents), and its ids unique (QUAIL-B's rule, which a run
///   checks when it reads the table), so documents are keyed by id.
///
/// The AI calls stay function calls here; the analyzer rule
/// ([`aisql_engine::sql::rewrite`]) makes them AI operators, as for any plan.
pub struct QuailbConsumer<'a> {
    extensions: Extensions,
    session: &'a SqlSession,
    state: &'a SessionState,
    hints: Mutex<Vec<OperatorHint>>,
}

impl<'a> QuailbConsumer<'a> {
    /// A consumer for `plan` in `session`, whose state is `state`: the tables
    /// its reads name are registered in `state` as they are read.
    pub fn new(session: &'a SqlSession, state: &'a SessionState, plan: &Plan) -> DfResult<Self> {
        Ok(Self {
            extensions: Extensions::try_from(&plan.extensions)?,
            session,
            state,
            hints: Mutex::default(),
        })
    }

    /// The operator hints recorded so far, in post-order.
    pub fn hints(&self) -> Vec<OperatorHint> {
        self.hints.lock().expect("hints lock").clone()
    }

    fn hint(&self, relation: &'static str, common: Option<&RelCommon>) {
        let id = common
            .and_then(|c| c.hint.as_ref())
            .map(|h| h.alias.clone())
            .filter(|a| !a.is_empty());
        self.hints
            .lock()
            .expect("hints lock")
            .push(OperatorHint { relation, id });
    }

    /// Registers (or widens) the empty table a read declares.
    async fn declare_table(&self, rel: &ReadRel) -> DfResult<()> {
        let table = match &rel.read_type {
            Some(ReadType::NamedTable(t)) if t.names.len() == 1 => t.names[0].clone(),
            _ => {
                return Err(DataFusionError::External(Box::new(BenchError::NotQuailb(
                    "a read must name exactly one table".into(),
                ))));
            }
        };
        let declared = rel.base_schema.as_ref().ok_or_else(|| {
            DataFusionError::Plan(format!("the read of {table} has no base schema"))
        })?;
        let declared = from_substrait_named_struct(self, declared)?;
        let schema = self
            .state
            .schema_for_ref(TableReference::bare(table.as_str()))?;
        let mut fields: Vec<Arc<Field>> = schema
            .table(&table)
            .await?
            .map(|t| t.schema().fields().iter().cloned().collect())
            .unwrap_or_default();
        for f in declared.fields() {
            if !fields.iter().any(|g| g.name() == f.name()) {
                let served = match f.data_type() {
                    DataType::Utf8 | DataType::LargeUtf8 => {
                        f.as_ref().clone().with_data_type(DataType::Utf8View)
                    }
                    _ => f.as_ref().clone(),
                };
                fields.push(Arc::new(served));
            }
        }
        schema.deregister_table(&table)?;
        let provider = EmptyTable::new(Arc::new(Schema::new(fields)));
        schema.register_table(table.clone(), Arc::new(provider))?;
        self.session.set_unique_ids(&table);
        Ok(())
    }
}

#[async_trait]
impl SubstraitConsumer for QuailbConsumer<'_> {
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
        let alias = rel
            .common
            .as_ref()
            .and_then(|c| c.hint.as_ref())
            .map(|h| h.alias.clone())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| {
                DataFusionError::External(Box::new(BenchError::NotQuailb(
                    "a read has no alias hint".into(),
                )))
            })?;
        self.declare_table(rel).await?;
        let plan = aisql_engine::sql::consume::consume_read(self, rel).await?;
        LogicalPlanBuilder::from(plan).alias(alias)?.build()
    }

    async fn consume_rel(&self, rel: &Rel) -> DfResult<LogicalPlan> {
        aisql_engine::sql::consume::consume_rel(self, rel).await
    }

    async fn consume_field_reference(
        &self,
        reference: &FieldReference,
        input_schema: &DFSchema,
    ) -> DfResult<Expr> {
        aisql_engine::sql::consume::consume_field_reference(self, reference, input_schema).await
    }

    /// An AI function is called with as many arguments as its declared
    /// signature (`ai_filter:str_str`) lists.
    async fn consume_scalar_function(
        &self,
        f: &ScalarFunction,
        input_schema: &DFSchema,
    ) -> DfResult<Expr> {
        if let Some(name) = self.extensions.functions.get(&f.function_reference)
            && let Some((base, signature)) = name.split_once(':')
            && aisql_engine::exec::ai_functions::AiFunction::from_name(base).is_some()
        {
            let declared = signature.split('_').count();
            if f.arguments.len() != declared {
                return plan_err!(
                    "{base} takes {declared} arguments, got {} (declared as {name})",
                    f.arguments.len()
                );
            }
        }
        from_scalar_function(self, f, input_schema).await
    }

    async fn consume_filter(&self, rel: &FilterRel) -> DfResult<LogicalPlan> {
        let plan = from_filter_rel(self, rel).await?;
        self.hint("filter", rel.common.as_ref());
        Ok(plan)
    }

    async fn consume_join(&self, rel: &JoinRel) -> DfResult<LogicalPlan> {
        let plan = from_join_rel(self, rel).await?;
        self.hint("join", rel.common.as_ref());
        Ok(plan)
    }

    async fn consume_project(&self, rel: &ProjectRel) -> DfResult<LogicalPlan> {
        let plan = from_project_rel(self, rel).await?;
        self.hint("project", rel.common.as_ref());
        let names = rel
            .common
            .as_ref()
            .and_then(|c| c.hint.as_ref())
            .map(|h| h.output_names.clone())
            .unwrap_or_default();
        match plan {
            LogicalPlan::Projection(p) if !names.is_empty() && names.len() == p.expr.len() => {
                let exprs = p
                    .expr
                    .iter()
                    .zip(p.schema.iter())
                    .zip(&names)
                    .map(|((e, (qualifier, field)), name)| {
                        let (q, n) = name
                            .split_once('.')
                            .map_or((None, name.as_str()), |(q, n)| (Some(q), n));
                        let same = field.name() == n && qualifier.map(|t| t.table()) == q;
                        match (same, q) {
                            (true, _) => e.clone(),
                            (false, Some(q)) => e.clone().alias_qualified(Some(q), n),
                            (false, None) => e.clone().alias(n),
                        }
                    })
                    .collect::<Vec<_>>();
                Ok(LogicalPlan::Projection(Projection::try_new(
                    exprs, p.input,
                )?))
            }
            plan => Ok(plan),
        }
    }
}

/// Consumes the QUAIL-B `plan` in `session` with [`QuailbConsumer`], over the
/// empty tables its reads declare, and runs the analyzer, whose AI rewrite
/// makes the AI calls AI nodes. Returns the analyzed plan and the operator id
/// hints of the Substrait relations, in post-order.
pub async fn analyze(
    session: &SqlSession,
    plan: &Plan,
) -> Result<(LogicalPlan, Vec<OperatorHint>)> {
    let state = session.context().state();
    let consumer =
        QuailbConsumer::new(session, &state, plan).map_err(aisql_engine::sql::plan_error)?;
    let analyzed = session
        .analyze_substrait_with(&state, &consumer, plan)
        .await?;
    Ok((analyzed, consumer.hints()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use aisql_engine::sql::{Evaluation, SqlSession};

    use super::analyze;
    use crate::quailb::oracle::OracleBackend;

    /// QUAIL-B plans take the same checks as any plan's (their consumer is another).
    #[tokio::test]
    async fn a_quailb_plan_with_an_emit_outside_its_relation_is_an_error() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../bench/quailb/plans/IMDB-3.json");
        let mut plan = aisql_engine::sql::plan_file::read_plan_file(&path).unwrap();
        let s = SqlSession::new(
            Arc::new(OracleBackend::new(Default::default())),
            Default::default(),
            Evaluation::Operators,
        )
        .unwrap();
        assert!(analyze(&s, &plan).await.is_ok());
        let Some(datafusion_substrait::substrait::proto::plan_rel::RelType::Root(root)) =
            plan.relations[0].rel_type.as_mut()
        else {
            panic!("IMDB-3 has a root")
        };
        let Some(datafusion_substrait::substrait::proto::rel::RelType::Project(project)) =
            root.input.as_mut().unwrap().rel_type.as_mut()
        else {
            panic!("IMDB-3's root is a projection")
        };
        let Some(datafusion_substrait::substrait::proto::rel_common::EmitKind::Emit(emit)) =
            project.common.as_mut().unwrap().emit_kind.as_mut()
        else {
            panic!("IMDB-3's projection emits")
        };
        emit.output_mapping[0] = 99;
        let e = analyze(&s, &plan).await.unwrap_err().to_string();
        assert!(e.contains("emit names field 99"), "{e}");
    }
}
