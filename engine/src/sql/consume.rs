//! Substrait consumption that honours what the spec says must be honoured.
//! DataFusion 55's consumer reads most of a plan faithfully, but on some fields
//! it gives a wrong answer or panics; every consumer aisql uses routes its
//! relations, reads and field references through this module instead:
//!
//! - `RelCommon.emit`: DataFusion applies it without checking the indexes (one
//!   past the relation's output panics); here every index is checked first, and
//!   an empty mapping is a relation of zero columns, as the spec says.
//! - A virtual table's `filter` and `projection`: DataFusion drops both; here
//!   they become a filter and a selection above the values. (A named table's
//!   filter reaches the scan, and `read_filters` applies it.)
//! - A read's projection mask: DataFusion keeps top-level fields but ignores a
//!   selection inside a field and indexes without a bound; both are refused.
//! - Field references: checked against the schema they index.
//! - Refused, because DataFusion would drop or misread them: an
//!   `AdvancedExtension` enhancement (the spec forbids ignoring one), an
//!   aggregate measure in an intermediate phase, an aggregate with several
//!   grouping sets (DataFusion puts its `__grouping_id` between keys and
//!   measures; Substrait puts the grouping set's index last), a named table of
//!   more than three name parts, a local file read from a byte offset.
//! - Missing inputs and sort expressions, which DataFusion unwraps: errors.
//!
//! `best_effort_filter` is left to DataFusion, which ignores it: the spec lets a
//! consumer return rows that fail it.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::TableProvider;
use datafusion::common::{DFSchema, TableReference};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{FunctionRegistry, SessionState};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, Projection};
use datafusion_substrait::extensions::Extensions;
use datafusion_substrait::logical_plan::consumer::{
    DefaultSubstraitConsumer, SubstraitConsumer, from_field_reference, from_read_rel,
    from_substrait_plan_with_consumer,
};
use datafusion_substrait::substrait::proto::AggregationPhase;
use datafusion_substrait::substrait::proto::expression::FieldReference;
use datafusion_substrait::substrait::proto::expression::field_reference::{
    ReferenceType, RootType,
};
use datafusion_substrait::substrait::proto::expression::reference_segment;
use datafusion_substrait::substrait::proto::extensions::AdvancedExtension;
use datafusion_substrait::substrait::proto::extensions::simple_extension_declaration::MappingType;
use datafusion_substrait::substrait::proto::read_rel::ReadType;
use datafusion_substrait::substrait::proto::read_rel::local_files::FileOrFiles;
use datafusion_substrait::substrait::proto::rel::RelType;
use datafusion_substrait::substrait::proto::rel_common::EmitKind;
use datafusion_substrait::substrait::proto::{Plan, ReadRel, Rel, RelCommon, SortField, plan_rel};

use crate::error::EngineError;
use crate::sql::export::DATAFUSION_URN;

/// A plan from any producer as DataFusion's plan: DataFusion's default
/// consumer with this module's checks.
pub async fn general_plan(state: &SessionState, plan: &Plan) -> DfResult<LogicalPlan> {
    let extensions = Extensions::try_from(&plan.extensions)?;
    let foreign = foreign_type_variations(plan);
    if !foreign.is_empty() {
        return Err(refused(format!(
            "the plan declares type variations DataFusion cannot read ({}): it gives \
             each anchor a meaning of its own, and reads only those aisql's exports \
             declare under {DATAFUSION_URN}",
            foreign.join(", ")
        )));
    }
    consume_plan(&PlanConsumer::new(&extensions, state), plan).await
}

/// The names of the type variations `plan` declares under an extension other
/// than [`DATAFUSION_URN`], where aisql's exports declare DataFusion's own
/// (anchor 1 unsigned, ... as DataFusion's consumer reads them).
fn foreign_type_variations(plan: &Plan) -> Vec<String> {
    let ours = |reference: u32| {
        plan.extension_urns
            .iter()
            .any(|u| u.extension_urn_anchor == reference && u.urn == DATAFUSION_URN)
    };
    plan.extensions
        .iter()
        .filter_map(|e| match &e.mapping_type {
            Some(MappingType::ExtensionTypeVariation(v)) if !ours(v.extension_urn_reference) => {
                Some(format!("{} (anchor {})", v.name, v.type_variation_anchor))
            }
            _ => None,
        })
        .collect()
}

/// `plan` consumed by `consumer`, after the checks DataFusion skips at the root.
pub async fn consume_plan(consumer: &impl SubstraitConsumer, plan: &Plan) -> DfResult<LogicalPlan> {
    refuse_enhancement(plan.advanced_extensions.as_ref(), "the plan")?;
    if let [relation] = plan.relations.as_slice()
        && let Some(plan_rel::RelType::Root(root)) = &relation.rel_type
        && root.input.is_none()
    {
        return Err(refused("the plan's root relation has no input".into()));
    }
    from_substrait_plan_with_consumer(consumer, plan).await
}

/// DataFusion's default consumer, its relations, reads and field references
/// taken through this module.
pub struct PlanConsumer<'a> {
    inner: DefaultSubstraitConsumer<'a>,
}

impl<'a> PlanConsumer<'a> {
    /// A consumer of a plan with `extensions` over the tables and functions of `state`.
    pub fn new(extensions: &'a Extensions, state: &'a SessionState) -> Self {
        Self {
            inner: DefaultSubstraitConsumer::new(extensions, state),
        }
    }
}

#[async_trait]
impl SubstraitConsumer for PlanConsumer<'_> {
    async fn resolve_table_ref(
        &self,
        table_ref: &TableReference,
    ) -> DfResult<Option<Arc<dyn TableProvider>>> {
        self.inner.resolve_table_ref(table_ref).await
    }

    fn get_extensions(&self) -> &Extensions {
        self.inner.get_extensions()
    }

    fn get_function_registry(&self) -> &impl FunctionRegistry {
        self.inner.get_function_registry()
    }

    async fn consume_rel(&self, rel: &Rel) -> DfResult<LogicalPlan> {
        consume_rel(self, rel).await
    }

    async fn consume_read(&self, rel: &ReadRel) -> DfResult<LogicalPlan> {
        consume_read(self, rel).await
    }

    async fn consume_field_reference(
        &self,
        reference: &FieldReference,
        input_schema: &DFSchema,
    ) -> DfResult<Expr> {
        consume_field_reference(self, reference, input_schema).await
    }

    fn push_outer_schema(&self, schema: Arc<DFSchema>) {
        self.inner.push_outer_schema(schema)
    }

    fn pop_outer_schema(&self) {
        self.inner.pop_outer_schema()
    }

    fn get_outer_schema(&self, steps_out: usize) -> Option<Arc<DFSchema>> {
        self.inner.get_outer_schema(steps_out)
    }

    fn push_lambda_parameters(
        &self,
        parameters: &[datafusion_substrait::substrait::proto::Type],
        input_schema: &DFSchema,
    ) -> DfResult<Vec<String>> {
        self.inner.push_lambda_parameters(parameters, input_schema)
    }

    fn pop_lambda_parameters(&self) {
        self.inner.pop_lambda_parameters()
    }

    fn lambda_variable(&self, steps_out: usize, field_idx: usize) -> DfResult<Expr> {
        self.inner.lambda_variable(steps_out, field_idx)
    }
}

/// One relation: refused if it carries what DataFusion would drop, consumed by
/// `consumer`'s method for its type, then its emit applied, checked.
pub async fn consume_rel(consumer: &impl SubstraitConsumer, rel: &Rel) -> DfResult<LogicalPlan> {
    let Some(rel_type) = &rel.rel_type else {
        return Err(refused("a relation has no type".into()));
    };
    let (common, advanced) = parts(rel_type);
    let name = relation_name(rel_type, common);
    refuse_enhancement(common.and_then(|c| c.advanced_extension.as_ref()), &name)?;
    refuse_enhancement(advanced, &name)?;
    check_relation(rel_type, &name)?;
    let plan = match rel_type {
        RelType::Read(r) => consumer.consume_read(r).await,
        RelType::Filter(r) => consumer.consume_filter(r).await,
        RelType::Fetch(r) => consumer.consume_fetch(r).await,
        RelType::Aggregate(r) => consumer.consume_aggregate(r).await,
        RelType::Sort(r) => consumer.consume_sort(r).await,
        RelType::Join(r) => consumer.consume_join(r).await,
        RelType::Project(r) => consumer.consume_project(r).await,
        RelType::Set(r) => consumer.consume_set(r).await,
        RelType::Cross(r) => consumer.consume_cross(r).await,
        RelType::Window(r) => consumer.consume_consistent_partition_window(r).await,
        RelType::Exchange(r) => consumer.consume_exchange(r).await,
        RelType::ExtensionLeaf(r) => consumer.consume_extension_leaf(r).await,
        RelType::ExtensionSingle(r) => consumer.consume_extension_single(r).await,
        RelType::ExtensionMulti(r) => consumer.consume_extension_multi(r).await,
        _ => return Err(refused(format!("{name} is not supported"))),
    }?;
    match common.and_then(|c| c.emit_kind.as_ref()) {
        Some(EmitKind::Emit(emit)) => select(plan, &emit.output_mapping, &format!("{name}'s emit")),
        Some(EmitKind::Direct(_)) | None => Ok(plan),
    }
}

/// A read, with what DataFusion drops or misreads of it applied or refused.
pub async fn consume_read(
    consumer: &impl SubstraitConsumer,
    read: &ReadRel,
) -> DfResult<LogicalPlan> {
    let name = relation_name_of_read(read);
    let mask: Option<Vec<i32>> = match read.projection.as_ref().and_then(|m| m.select.as_ref()) {
        Some(select) => Some(
            select
                .struct_items
                .iter()
                .map(|item| match item.child {
                    Some(_) => Err(refused(format!(
                        "{name}'s projection selects inside field {}; only whole fields can be read",
                        item.field
                    ))),
                    None => Ok(item.field),
                })
                .collect::<DfResult<_>>()?,
        ),
        None => None,
    };
    if let Some(mask) = &mask
        && let Some(width) = base_width(read)
    {
        check_indexes(mask, width, &format!("{name}'s projection"))?;
    }
    match &read.read_type {
        Some(ReadType::NamedTable(t)) if t.names.len() > 3 => {
            return Err(refused(format!(
                "{name} names a table in {} parts; at most catalog, schema and table are understood",
                t.names.len()
            )));
        }
        Some(ReadType::NamedTable(t)) => {
            refuse_enhancement(t.advanced_extension.as_ref(), &name)?;
        }
        Some(ReadType::LocalFiles(files)) => {
            if let Some(item) = files.items.iter().find(|f: &&FileOrFiles| f.start > 0) {
                return Err(refused(format!(
                    "{name} reads a file from byte {}; only whole files can be read",
                    item.start
                )));
            }
            refuse_enhancement(files.advanced_extension.as_ref(), &name)?;
        }
        Some(ReadType::VirtualTable(_)) if read.filter.is_some() || mask.is_some() => {
            // DataFusion builds the values alone: the filter and mask go above.
            let values = ReadRel {
                filter: None,
                best_effort_filter: None,
                projection: None,
                ..read.clone()
            };
            let mut plan = from_read_rel(consumer, &values).await?;
            if let Some(filter) = &read.filter {
                let predicate = consumer.consume_expression(filter, plan.schema()).await?;
                plan = LogicalPlanBuilder::from(plan).filter(predicate)?.build()?;
            }
            return match &mask {
                Some(mask) => select(plan, mask, &format!("{name}'s projection")),
                None => Ok(plan),
            };
        }
        _ => {}
    }
    from_read_rel(consumer, read).await
}

/// A field reference, refused when its index is outside the schema it reads
/// (DataFusion indexes without a bound).
pub async fn consume_field_reference(
    consumer: &impl SubstraitConsumer,
    reference: &FieldReference,
    input_schema: &DFSchema,
) -> DfResult<Expr> {
    if let Some(ReferenceType::DirectReference(segment)) = &reference.reference_type
        && let Some(reference_segment::ReferenceType::StructField(field)) = &segment.reference_type
    {
        let outer;
        let (schema, place) = match &reference.root_type {
            None | Some(RootType::RootReference(_)) => {
                (Some(input_schema), "its input".to_string())
            }
            Some(RootType::OuterReference(o)) => {
                outer = consumer.get_outer_schema(o.steps_out as usize);
                (
                    outer.as_deref(),
                    format!("the query {} level(s) out", o.steps_out),
                )
            }
            Some(_) => (None, String::new()),
        };
        if let Some(schema) = schema {
            check_indexes(
                &[field.field],
                schema.fields().len(),
                &format!("a field reference into {place} ({})", field_names(schema)),
            )?;
        }
    }
    from_field_reference(consumer, reference, input_schema).await
}

/// The fields of `plan` at `indexes`, in that order (a repeated field gets a
/// fresh name), after checking every index; none is a relation of zero columns.
fn select(plan: LogicalPlan, indexes: &[i32], what: &str) -> DfResult<LogicalPlan> {
    let picks = check_indexes(indexes, plan.schema().fields().len(), what)?;
    let (exprs, input) = match plan {
        // Picking from a projection's expressions keeps one projection, as
        // DataFusion does; a volatile expression picked twice must not run twice.
        LogicalPlan::Projection(p) if !p.expr.iter().any(Expr::is_volatile) => {
            (picks.iter().map(|&i| p.expr[i].clone()).collect(), p.input)
        }
        plan => {
            let columns = plan.schema().columns();
            let exprs = picks
                .iter()
                .map(|&i| Expr::Column(columns[i].clone()))
                .collect();
            (exprs, Arc::new(plan))
        }
    };
    Ok(LogicalPlan::Projection(Projection::try_new(
        uniquely_named(exprs),
        input,
    )?))
}

/// `exprs` with every repeated output name made unique by a suffix.
fn uniquely_named(exprs: Vec<Expr>) -> Vec<Expr> {
    let mut seen = HashSet::new();
    exprs
        .into_iter()
        .map(|e| {
            let name = e.schema_name().to_string();
            if seen.insert(name.clone()) {
                return e;
            }
            let fresh = (1..)
                .map(|n| format!("{name}__{n}"))
                .find(|n| !seen.contains(n))
                .expect("an unbounded range has an unused suffix");
            seen.insert(fresh.clone());
            e.unalias().alias(fresh)
        })
        .collect()
}

/// `indexes` as positions in a relation of `width` fields, or an error naming
/// `what` and the first index outside it.
fn check_indexes(indexes: &[i32], width: usize, what: &str) -> DfResult<Vec<usize>> {
    indexes
        .iter()
        .map(|&i| {
            usize::try_from(i)
                .ok()
                .filter(|&i| i < width)
                .ok_or_else(|| {
                    refused(format!(
                        "{what} names field {i}, but there are {width} field(s){}",
                        if width == 0 {
                            String::new()
                        } else {
                            format!(" (0 to {})", width - 1)
                        }
                    ))
                })
        })
        .collect()
}

/// What DataFusion would drop or unwrap in one relation's own fields.
fn check_relation(rel_type: &RelType, name: &str) -> DfResult<()> {
    let missing = |side: &str| Err(refused(format!("{name} has no {side} input")));
    let sorts = |sorts: &[SortField], owner: &str| match sorts.iter().position(|s| s.expr.is_none())
    {
        Some(i) => Err(refused(format!(
            "sort field {i} of {owner} has no expression"
        ))),
        None => Ok(()),
    };
    match rel_type {
        RelType::Join(j) if j.left.is_none() => missing("left"),
        RelType::Join(j) if j.right.is_none() => missing("right"),
        RelType::Cross(c) if c.left.is_none() => missing("left"),
        RelType::Cross(c) if c.right.is_none() => missing("right"),
        RelType::Sort(s) => sorts(&s.sorts, name),
        RelType::Aggregate(a) => {
            if a.groupings.len() > 1 {
                return Err(refused(format!(
                    "{name} has {} grouping sets: DataFusion would place its grouping id between the keys and the measures, where Substrait places the measures, so its columns would be misread",
                    a.groupings.len()
                )));
            }
            let declared = a.grouping_expressions.len();
            for grouping in &a.groupings {
                if let Some(r) = grouping
                    .expression_references
                    .iter()
                    .find(|&&r| r as usize >= declared)
                {
                    return Err(refused(format!(
                        "{name}'s grouping refers to grouping expression {r}, but it declares {declared}"
                    )));
                }
            }
            for (i, measure) in a.measures.iter().enumerate() {
                let Some(f) = &measure.measure else { continue };
                let phase =
                    AggregationPhase::try_from(f.phase).unwrap_or(AggregationPhase::Unspecified);
                // An unspecified phase is what every producer writes for a
                // complete aggregate (DataFusion's own included).
                if !matches!(
                    phase,
                    AggregationPhase::Unspecified | AggregationPhase::InitialToResult
                ) {
                    return Err(refused(format!(
                        "measure {i} of {name} is in phase {}; only complete aggregates (initial to result) are computed",
                        phase.as_str_name()
                    )));
                }
                sorts(&f.sorts, &format!("measure {i} of {name}"))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// An error for a plan whose `extension` alters its meaning in a way aisql does
/// not know: the spec forbids ignoring an enhancement.
fn refuse_enhancement(extension: Option<&AdvancedExtension>, owner: &str) -> DfResult<()> {
    match extension.and_then(|e| e.enhancement.as_ref()) {
        Some(e) => Err(refused(format!(
            "{owner} carries an advanced-extension enhancement ({}), which changes its meaning and which aisql does not know",
            e.type_url
        ))),
        None => Ok(()),
    }
}

/// A relation's common fields and its own advanced extension.
fn parts(rel_type: &RelType) -> (Option<&RelCommon>, Option<&AdvancedExtension>) {
    match rel_type {
        RelType::Read(r) => (r.common.as_ref(), r.advanced_extension.as_ref()),
        RelType::Filter(r) => (r.common.as_ref(), r.advanced_extension.as_ref()),
        RelType::Fetch(r) => (r.common.as_ref(), r.advanced_extension.as_ref()),
        RelType::Aggregate(r) => (r.common.as_ref(), r.advanced_extension.as_ref()),
        RelType::Sort(r) => (r.common.as_ref(), r.advanced_extension.as_ref()),
        RelType::Join(r) => (r.common.as_ref(), r.advanced_extension.as_ref()),
        RelType::Project(r) => (r.common.as_ref(), r.advanced_extension.as_ref()),
        RelType::Set(r) => (r.common.as_ref(), r.advanced_extension.as_ref()),
        RelType::Cross(r) => (r.common.as_ref(), r.advanced_extension.as_ref()),
        RelType::Window(r) => (r.common.as_ref(), r.advanced_extension.as_ref()),
        RelType::Exchange(r) => (r.common.as_ref(), r.advanced_extension.as_ref()),
        RelType::ExtensionLeaf(r) => (r.common.as_ref(), None),
        RelType::ExtensionSingle(r) => (r.common.as_ref(), None),
        RelType::ExtensionMulti(r) => (r.common.as_ref(), None),
        _ => (None, None),
    }
}

/// "the filter relation", with its alias hint when it has one: how errors name it.
fn relation_name(rel_type: &RelType, common: Option<&RelCommon>) -> String {
    if let RelType::Read(read) = rel_type {
        return relation_name_of_read(read);
    }
    let kind = match rel_type {
        RelType::Filter(_) => "filter",
        RelType::Fetch(_) => "fetch",
        RelType::Aggregate(_) => "aggregate",
        RelType::Sort(_) => "sort",
        RelType::Join(_) => "join",
        RelType::Project(_) => "project",
        RelType::Set(_) => "set",
        RelType::Cross(_) => "cross",
        RelType::Window(_) => "window",
        RelType::Exchange(_) => "exchange",
        RelType::ExtensionLeaf(_) | RelType::ExtensionSingle(_) | RelType::ExtensionMulti(_) => {
            "extension"
        }
        RelType::Reference(_) => "reference",
        RelType::Write(_) => "write",
        RelType::Ddl(_) => "DDL",
        RelType::HashJoin(_) => "hash join",
        RelType::MergeJoin(_) => "merge join",
        RelType::NestedLoopJoin(_) => "nested loop join",
        RelType::Expand(_) => "expand",
        RelType::Update(_) => "update",
        RelType::Read(_) => "read",
    };
    match alias(common) {
        Some(alias) => format!("the {kind} relation `{alias}`"),
        None => format!("the {kind} relation"),
    }
}

/// "the read of nation" (or of values, of files), with its alias hint.
fn relation_name_of_read(read: &ReadRel) -> String {
    let source = match &read.read_type {
        Some(ReadType::NamedTable(t)) => t.names.join("."),
        Some(ReadType::VirtualTable(_)) => "values".into(),
        Some(ReadType::LocalFiles(_)) => "local files".into(),
        _ => "a table".into(),
    };
    match alias(read.common.as_ref()) {
        Some(alias) => format!("the read of {source} (`{alias}`)"),
        None => format!("the read of {source}"),
    }
}

fn alias(common: Option<&RelCommon>) -> Option<&str> {
    common
        .and_then(|c| c.hint.as_ref())
        .map(|h| h.alias.as_str())
        .filter(|a| !a.is_empty())
}

/// How many top-level fields a read's base schema declares.
fn base_width(read: &ReadRel) -> Option<usize> {
    read.base_schema
        .as_ref()
        .and_then(|s| s.r#struct.as_ref())
        .map(|s| s.types.len())
}

/// `a, b, c`: a schema's first field names, to say which input an index misses.
fn field_names(schema: &DFSchema) -> String {
    const SHOWN: usize = 8;
    let fields = schema.fields();
    let mut names: Vec<&str> = fields
        .iter()
        .take(SHOWN)
        .map(|f| f.name().as_str())
        .collect();
    if fields.len() > SHOWN {
        names.push("...");
    }
    if names.is_empty() {
        "no fields".into()
    } else {
        names.join(", ")
    }
}

fn refused(message: String) -> DataFusionError {
    EngineError::InvalidPlan(message).into()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion_substrait::substrait::proto::Plan;
    use serde_json::{Value, json};

    use crate::inference::backend::NoAnswers;
    use crate::sql::options::QueryOptions;
    use crate::sql::{Evaluation, SqlSession, row_lines};

    /// `t(k, name, r)`: k = 0..9, name = "name{k}", r = k % 3; `u(r, label)`:
    /// r = 0..2 labelled zero, one, two.
    async fn session() -> (SqlSession, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t.csv");
        let mut text = String::from("k,name,r\n");
        for k in 0..10 {
            text.push_str(&format!("{k},name{k},{}\n", k % 3));
        }
        std::fs::write(&t, text).unwrap();
        let u = dir.path().join("u.csv");
        std::fs::write(&u, "r,label\n0,zero\n1,one\n2,two\n").unwrap();
        let s = SqlSession::new(
            Arc::new(NoAnswers),
            QueryOptions::default(),
            Evaluation::Operators,
        )
        .unwrap();
        s.register("t", &t).await.unwrap();
        s.register("u", &u).await.unwrap();
        (s, dir)
    }

    fn nullable(kind: &str) -> Value {
        json!({ kind: { "nullability": "NULLABILITY_NULLABLE" } })
    }

    fn schema(columns: &[(&str, &str)]) -> Value {
        json!({
            "names": columns.iter().map(|c| c.0).collect::<Vec<_>>(),
            "struct": {
                "types": columns.iter().map(|c| nullable(c.1)).collect::<Vec<_>>(),
                "nullability": "NULLABILITY_REQUIRED"
            }
        })
    }

    fn read_t() -> Value {
        json!({ "read": {
            "baseSchema": schema(&[("k", "i64"), ("name", "string"), ("r", "i64")]),
            "namedTable": { "names": ["t"] }
        }})
    }

    fn read_u() -> Value {
        json!({ "read": {
            "baseSchema": schema(&[("r", "i64"), ("label", "string")]),
            "namedTable": { "names": ["u"] }
        }})
    }

    fn field(i: i64) -> Value {
        json!({ "selection": { "directReference": { "structField": { "field": i } }, "rootReference": {} } })
    }

    fn int(v: i64) -> Value {
        json!({ "literal": { "i64": v.to_string() } })
    }

    /// `a = b` (function anchor 1).
    fn equal(a: Value, b: Value) -> Value {
        json!({ "scalarFunction": {
            "functionReference": 1,
            "arguments": [{ "value": a }, { "value": b }],
            "outputType": nullable("bool")
        }})
    }

    fn filter(input: Value, condition: Value) -> Value {
        json!({ "filter": { "input": input, "condition": condition } })
    }

    /// `rel` (one key: its type) with `common` set to `value`.
    fn with_common(mut rel: Value, value: Value) -> Value {
        let body = rel.as_object_mut().unwrap().values_mut().next().unwrap();
        body["common"] = value;
        rel
    }

    fn emit(rel: Value, mapping: &[i64]) -> Value {
        with_common(rel, json!({ "emit": { "outputMapping": mapping } }))
    }

    fn sort_by_k(input: Value, direction: &str) -> Value {
        json!({ "sort": { "input": input, "sorts": [{ "expr": field(0), "direction": direction }] } })
    }

    /// `input` grouped by its field `key` with `sum(field value)` (anchor 2).
    fn sum_by(input: Value, key: i64, value: i64) -> Value {
        json!({ "aggregate": {
            "input": input,
            "groupingExpressions": [field(key)],
            "groupings": [{ "expressionReferences": [0] }],
            "measures": [{ "measure": {
                "functionReference": 2,
                "arguments": [{ "value": field(value) }],
                "outputType": nullable("i64"),
                "phase": "AGGREGATION_PHASE_INITIAL_TO_RESULT"
            }}]
        }})
    }

    fn plan(rel: Value) -> Plan {
        let uri = "https://github.com/substrait-io/substrait/blob/main/extensions";
        serde_json::from_value(json!({
            "extensionUris": [
                { "extensionUriAnchor": 1, "uri": format!("{uri}/functions_comparison.yaml") },
                { "extensionUriAnchor": 2, "uri": format!("{uri}/functions_arithmetic.yaml") }
            ],
            "extensions": [
                { "extensionFunction": { "extensionUriReference": 1, "functionAnchor": 1, "name": "equal:any_any" } },
                { "extensionFunction": { "extensionUriReference": 2, "functionAnchor": 2, "name": "sum:i64" } },
                { "extensionFunction": { "extensionUriReference": 2, "functionAnchor": 3, "name": "count:" } }
            ],
            "relations": [{ "root": { "input": rel } }]
        }))
        .unwrap()
    }

    /// The rows of `rel`, each `a | b`, in the plan's order.
    async fn rows(s: &SqlSession, rel: Value) -> crate::error::Result<Vec<String>> {
        let planned = s.plan_substrait(&plan(rel)).await?;
        let out = s.run_plan(planned, std::time::Instant::now()).await?;
        row_lines(&out.batches)
    }

    async fn sorted_rows(s: &SqlSession, rel: Value) -> Vec<String> {
        let mut rows = rows(s, rel).await.unwrap();
        rows.sort();
        rows
    }

    async fn error(s: &SqlSession, rel: Value) -> String {
        match s.plan_substrait(&plan(rel)).await {
            Ok(p) => panic!("planned:\n{}", p.display_indent()),
            Err(e) => e.to_string(),
        }
    }

    fn sorted(rows: impl IntoIterator<Item = String>) -> Vec<String> {
        let mut rows: Vec<String> = rows.into_iter().collect();
        rows.sort();
        rows
    }

    #[tokio::test]
    async fn emit_selects_and_orders_the_fields_of_every_relation() {
        let (s, _dir) = session().await;
        let label = |r: i64| ["zero", "one", "two"][r as usize];
        // Read: r, then k.
        assert_eq!(
            sorted_rows(&s, emit(read_t(), &[2, 0])).await,
            sorted((0..10).map(|k| format!("{} | {k}", k % 3)))
        );
        // Filter r = 1: name only.
        let r_is_1 = filter(read_t(), equal(field(2), int(1)));
        assert_eq!(
            sorted_rows(&s, emit(r_is_1, &[1])).await,
            ["name1", "name4", "name7"]
        );
        // Project: the input's three fields, then k = 3; the comparison, then name.
        let project =
            json!({ "project": { "input": read_t(), "expressions": [equal(field(0), int(3))] } });
        assert_eq!(
            sorted_rows(&s, emit(project, &[3, 1])).await,
            sorted((0..10).map(|k| format!("{} | name{k}", k == 3)))
        );
        // Join t and u on r: u's label (field 3 + 1), then t's k.
        let join = json!({ "join": {
            "left": read_t(), "right": read_u(),
            "expression": equal(field(2), field(3)),
            "type": "JOIN_TYPE_INNER"
        }});
        assert_eq!(
            sorted_rows(&s, emit(join, &[4, 0])).await,
            sorted((0..10).map(|k| format!("{} | {k}", label(k % 3))))
        );
        // Aggregate: the sums alone (keys 0, 1, 2 sum 0+3+6+9, 1+4+7, 2+5+8).
        assert_eq!(
            sorted_rows(&s, emit(sum_by(read_t(), 2, 0), &[1])).await,
            ["12", "15", "18"]
        );
        // The same field twice, under two names.
        assert_eq!(
            sorted_rows(
                &s,
                emit(filter(read_t(), equal(field(0), int(4))), &[0, 0, 2])
            )
            .await,
            ["4 | 4 | 1"]
        );
        // Sort, cross and set relations: kept order, u's label, the first field.
        assert_eq!(
            rows(
                &s,
                emit(sort_by_k(read_t(), "SORT_DIRECTION_DESC_NULLS_LAST"), &[0])
            )
            .await
            .unwrap(),
            (0..10).rev().map(|k| k.to_string()).collect::<Vec<_>>()
        );
        let cross = json!({ "cross": { "left": read_u(), "right": read_u() } });
        assert_eq!(
            sorted_rows(&s, emit(cross, &[3])).await,
            sorted((0..9).map(|i| label(i / 3).to_string()))
        );
        let set = json!({ "set": { "inputs": [read_u(), read_u()], "op": "SET_OP_UNION_ALL" } });
        assert_eq!(
            sorted_rows(&s, emit(set, &[1])).await,
            ["one", "one", "two", "two", "zero", "zero"]
        );
    }

    fn read_t_with(key: &str, value: Value) -> Value {
        let mut rel = read_t();
        rel["read"][key] = value;
        rel
    }

    fn mask(fields: &[i64]) -> Value {
        json!({ "select": { "structItems": fields.iter().map(|f| json!({ "field": f })).collect::<Vec<_>>() }, "maintainSingularStruct": true })
    }

    #[tokio::test]
    async fn a_read_projection_masks_after_the_filter_and_before_the_emit() {
        let (s, _dir) = session().await;
        // The filter reads the base schema (r is field 2), the mask picks name
        // then k, and the emit indexes the masked fields (1 is k).
        let mut read = read_t_with("projection", mask(&[1, 0]));
        read["read"]["filter"] = equal(field(2), int(1));
        assert_eq!(
            sorted_rows(&s, read.clone()).await,
            ["name1 | 1", "name4 | 4", "name7 | 7"]
        );
        assert_eq!(sorted_rows(&s, emit(read, &[1])).await, ["1", "4", "7"]);
    }

    /// A virtual table: DataFusion builds the values and drops the read's
    /// filter and mask.
    fn values() -> Value {
        let row =
            |k: i64, name: &str| json!({ "fields": [int(k), { "literal": { "string": name } }] });
        json!({ "read": {
            "baseSchema": schema(&[("k", "i64"), ("name", "string")]),
            "virtualTable": { "expressions": [row(1, "a"), row(2, "b"), row(3, "c")] }
        }})
    }

    #[tokio::test]
    async fn a_values_read_applies_its_filter_and_projection() {
        let (s, _dir) = session().await;
        assert_eq!(sorted_rows(&s, values()).await, ["1 | a", "2 | b", "3 | c"]);
        let mut read = values();
        read["read"]["filter"] = equal(field(0), int(2));
        assert_eq!(sorted_rows(&s, read.clone()).await, ["2 | b"]);
        read["read"]["projection"] = mask(&[1]);
        assert_eq!(sorted_rows(&s, read.clone()).await, ["b"]);
        assert_eq!(sorted_rows(&s, emit(read, &[0, 0])).await, ["b | b"]);
    }

    #[tokio::test]
    async fn fetch_skips_its_offset_and_keeps_its_count_in_either_form() {
        let (s, _dir) = session().await;
        let fetch = |fields: Value| {
            let mut rel = json!({ "fetch": { "input": sort_by_k(read_t(), "SORT_DIRECTION_ASC_NULLS_FIRST") } });
            for (k, v) in fields.as_object().unwrap() {
                rel["fetch"][k] = v.clone();
            }
            emit(rel, &[0])
        };
        let ks = |range: std::ops::Range<i64>| range.map(|k| k.to_string()).collect::<Vec<_>>();
        let null_i64 = json!({ "literal": { "null": nullable("i64") } });
        let i32_literal = |v: i32| json!({ "literal": { "i32": v } });
        for (fields, want) in [
            (json!({ "offset": "2", "count": "3" }), ks(2..5)),
            (
                json!({ "offsetExpr": int(2), "countExpr": int(3) }),
                ks(2..5),
            ),
            (
                json!({ "offsetExpr": i32_literal(2), "countExpr": i32_literal(3) }),
                ks(2..5),
            ),
            // -1: every row; a null count: every row; a null offset: none skipped.
            (json!({ "offset": "7", "count": "-1" }), ks(7..10)),
            (
                json!({ "offsetExpr": int(8), "countExpr": null_i64.clone() }),
                ks(8..10),
            ),
            (
                json!({ "offsetExpr": null_i64, "countExpr": int(2) }),
                ks(0..2),
            ),
            (json!({ "count": "0" }), vec![]),
            (json!({ "offset": "20" }), vec![]),
        ] {
            assert_eq!(
                rows(&s, fetch(fields.clone())).await.unwrap(),
                want,
                "{fields}"
            );
        }
        for fields in [json!({ "count": "-2" }), json!({ "offsetExpr": int(-1) })] {
            let e = rows(&s, fetch(fields.clone()))
                .await
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("must be >= 0") || e.contains("must be >=0"),
                "{fields}: {e}"
            );
        }
    }

    #[tokio::test]
    async fn indexes_outside_a_relation_are_errors_naming_it() {
        let (s, _dir) = session().await;
        let r_is_1 = || filter(read_t(), equal(field(2), int(1)));
        for (rel, want) in [
            (
                emit(r_is_1(), &[0, 3]),
                "the filter relation's emit names field 3, but there are 3 field(s) (0 to 2)",
            ),
            (
                emit(r_is_1(), &[-1]),
                "the filter relation's emit names field -1",
            ),
            (
                emit(sum_by(read_t(), 2, 0), &[2]),
                "the aggregate relation's emit names field 2, but there are 2 field(s)",
            ),
            (
                json!({ "project": { "input": read_t(), "expressions": [field(7)] } }),
                "a field reference into its input (k, name, r) names field 7",
            ),
            (
                read_t_with("projection", mask(&[0, 3])),
                "the read of t's projection names field 3, but there are 3 field(s)",
            ),
            (
                read_t_with(
                    "projection",
                    json!({ "select": { "structItems": [{ "field": 1, "child": { "struct": { "structItems": [] } } }] } }),
                ),
                "the read of t's projection selects inside field 1",
            ),
        ] {
            let e = error(&s, rel).await;
            assert!(e.contains(want), "{e}\nshould contain: {want}");
        }
    }

    /// The plan of issue 32: a filter that emits no field under a projection
    /// of its field 0. DataFusion's consumer panicked in `dfschema.rs`.
    #[tokio::test]
    async fn an_empty_emit_is_a_relation_of_no_fields() {
        let (s, _dir) = session().await;
        let nothing = || emit(filter(read_t(), equal(field(2), int(1))), &[]);
        let project = json!({ "project": { "input": nothing(), "expressions": [field(0)] } });
        let e = error(&s, project).await;
        assert!(
            e.contains("a field reference into its input (no fields) names field 0, but there are 0 field(s)"),
            "{e}"
        );
        // Its rows are still there to count: r = 1 holds k = 1, 4, 7.
        let count = json!({ "aggregate": {
            "input": nothing(),
            "groupings": [],
            "measures": [{ "measure": { "functionReference": 3, "outputType": nullable("i64") } }]
        }});
        assert_eq!(rows(&s, count).await.unwrap(), ["3"]);
    }

    #[tokio::test]
    async fn what_datafusion_would_drop_is_refused_by_name() {
        let (s, _dir) = session().await;
        let mut two_sets = sum_by(read_t(), 2, 0);
        two_sets["aggregate"]["groupings"] = json!([{ "expressionReferences": [0] }, {}]);
        let mut intermediate = sum_by(read_t(), 2, 0);
        intermediate["aggregate"]["measures"][0]["measure"]["phase"] =
            json!("AGGREGATION_PHASE_INTERMEDIATE_TO_RESULT");
        let mut bad_reference = sum_by(read_t(), 2, 0);
        bad_reference["aggregate"]["groupings"][0]["expressionReferences"] = json!([1]);
        let enhancement = json!({ "advancedExtension": { "enhancement": {
            "typeUrl": "type.googleapis.com/example.Enhancement", "value": ""
        }}});
        let mut four_parts = read_t();
        four_parts["read"]["namedTable"]["names"] = json!(["a", "b", "c", "t"]);
        for (rel, want) in [
            (two_sets, "the aggregate relation has 2 grouping sets"),
            (
                intermediate,
                "measure 0 of the aggregate relation is in phase AGGREGATION_PHASE_INTERMEDIATE_TO_RESULT",
            ),
            (
                bad_reference,
                "the aggregate relation's grouping refers to grouping expression 1, but it declares 1",
            ),
            (
                with_common(
                    filter(read_t(), equal(field(2), int(1))),
                    json!({ "hint": { "alias": "f1" }, "advancedExtension": enhancement["advancedExtension"] }),
                ),
                "the filter relation `f1` carries an advanced-extension enhancement (type.googleapis.com/example.Enhancement)",
            ),
            (four_parts, "the read of a.b.c.t names a table in 4 parts"),
            (
                json!({ "join": { "left": read_t(), "type": "JOIN_TYPE_INNER" } }),
                "the join relation has no right input",
            ),
            (
                json!({ "sort": { "input": read_t(), "sorts": [{ "direction": "SORT_DIRECTION_ASC_NULLS_FIRST" }] } }),
                "sort field 0 of the sort relation has no expression",
            ),
        ] {
            let e = error(&s, rel).await;
            assert!(e.contains(want), "{e}\nshould contain: {want}");
        }
    }

    /// DataFusion reads a variation anchor by a meaning of its own: only the
    /// variations aisql's exports declare under its DataFusion extension are
    /// taken, any other producer's are named.
    #[test]
    fn only_aisqls_own_type_variations_are_read() {
        let plan = |urn: &str| -> Plan {
            serde_json::from_value(json!({
                "extensionUrns": [{ "extensionUrnAnchor": 7, "urn": urn }],
                "extensions": [{ "extensionTypeVariation": {
                    "extensionUrnReference": 7, "typeVariationAnchor": 1, "name": "unsigned"
                }}]
            }))
            .unwrap()
        };
        let ours = plan(crate::sql::export::DATAFUSION_URN);
        assert!(super::foreign_type_variations(&ours).is_empty());
        let theirs = plan("extension:example:types");
        assert_eq!(
            super::foreign_type_variations(&theirs),
            ["unsigned (anchor 1)"]
        );
    }
}
