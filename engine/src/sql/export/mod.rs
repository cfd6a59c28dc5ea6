//! SQL plans written as Substrait that consumers other than DataFusion, and
//! substrait-validator, accept (`aisql sql --to-substrait`).
//!
//! DataFusion's producer alone writes plans only its own consumer reads:
//! functions point at an extension never declared, measures and some calls
//! have no output type, cross joins no condition. An export is produced by
//! [`producer::ExportProducer`] (DataFusion's producer with those gaps filled),
//! its functions declared per extension ([`extensions`]), its type variations
//! plain or declared ([`variations`]); the root's names are unique. [`encode`]
//! writes the binary form and [`encode_json`] the ProtoJSON form, each with
//! the extension URIs of older Substrait besides the URNs ([`legacy`]).

mod extensions;
mod legacy;
mod producer;
mod variations;

use std::collections::{HashMap, HashSet};

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DFSchema, DataFusionError};
use datafusion::logical_expr::LogicalPlan;
use datafusion_substrait::logical_plan::producer::SubstraitProducer;
use datafusion_substrait::substrait::proto::{Plan, PlanRel, RelRoot, plan_rel};
use datafusion_substrait::substrait::version::version_with_producer;

pub use extensions::DATAFUSION_URN;
pub use legacy::{encode, encode_json};

/// `plan` (analyzed, AI calls still functions) as a Substrait plan.
pub fn to_substrait_plan(plan: &LogicalPlan) -> datafusion::common::Result<Plan> {
    let mut producer = producer::ExportProducer::default();
    let input = producer.handle_plan(plan)?;
    let (extension_urns, extensions) = producer.registry().declarations();
    let plan = Plan {
        version: Some(version_with_producer("aisql")),
        extension_urns,
        extensions,
        relations: vec![PlanRel {
            rel_type: Some(plan_rel::RelType::Root(RelRoot {
                input: Some(*input),
                names: root_names(plan.schema()),
            })),
        }],
        ..Default::default()
    };
    variations::settle(plan)
        .map_err(|e| DataFusionError::Substrait(format!("settling type variations: {e}")))
}

/// The root's output names, flattened as Substrait lists them (a struct's
/// fields after it). A relation's names must differ: a name that several
/// columns share (`d.id`, `t.id`) is written qualified, and numbered if that
/// is not enough.
fn root_names(schema: &DFSchema) -> Vec<String> {
    let mut shared: HashMap<&str, usize> = HashMap::new();
    for f in schema.fields() {
        *shared.entry(f.name().as_str()).or_default() += 1;
    }
    let mut used = HashSet::new();
    let mut names = Vec::new();
    for (qualifier, field) in schema.iter() {
        let base = match qualifier {
            Some(q) if shared[field.name().as_str()] > 1 => format!("{q}.{}", field.name()),
            _ => field.name().clone(),
        };
        let mut name = base.clone();
        let mut n = 2;
        while !used.insert(name.clone()) {
            name = format!("{base}_{n}");
            n += 1;
        }
        names.push(name);
        nested_names(field.data_type(), &mut names);
    }
    names
}

/// The names inside a value of type `t`, as DataFusion's producer and consumer
/// flatten them: a struct's fields, and those inside list items and map keys
/// and values.
fn nested_names(t: &DataType, names: &mut Vec<String>) {
    match t {
        DataType::Struct(fields) => {
            for f in fields {
                names.push(f.name().clone());
                nested_names(f.data_type(), names);
            }
        }
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            nested_names(item.data_type(), names)
        }
        DataType::Map(entries, _) => nested_names(entries.data_type(), names),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Fields, Schema};
    use datafusion::prelude::SessionContext;
    use datafusion_substrait::substrait::proto::expression::RexType;
    use datafusion_substrait::substrait::proto::rel::RelType;
    use datafusion_substrait::substrait::proto::{Expression, Rel};

    #[test]
    fn shared_root_names_are_qualified() {
        let schema = |q: &str| {
            DFSchema::try_from_qualified_schema(
                q,
                &Schema::new(vec![
                    Field::new("id", DataType::Utf8, false),
                    Field::new(
                        "s",
                        DataType::Struct(Fields::from(vec![Field::new(
                            "x",
                            DataType::Int32,
                            true,
                        )])),
                        true,
                    ),
                ]),
            )
            .unwrap()
        };
        let joined = schema("d").join(&schema("t")).unwrap();
        assert_eq!(
            root_names(&joined),
            ["d.id", "d.s", "x", "t.id", "t.s", "x"]
        );
        assert_eq!(root_names(&schema("d")), ["id", "s", "x"]);
    }

    /// `docs(id, body, score)` and `topics(id, name)`, empty, in `ctx`.
    async fn create_tables(ctx: &SessionContext) {
        ctx.sql("CREATE TABLE docs (id VARCHAR, body VARCHAR, score DOUBLE)")
            .await
            .unwrap();
        ctx.sql("CREATE TABLE topics (id VARCHAR NOT NULL, name VARCHAR)")
            .await
            .unwrap();
    }

    /// The analyzed plan of `sql` over `docs(id, body, score)` and `topics(id, name)`.
    async fn analyzed(sql: &str) -> LogicalPlan {
        let ctx = SessionContext::new();
        crate::exec::ai_functions::register_ai_functions(&ctx, None, None);
        create_tables(&ctx).await;
        let state = ctx.state();
        let plan = state.create_logical_plan(sql).await.unwrap();
        state
            .analyzer()
            .execute_and_check(plan, state.config_options(), |_, _| {})
            .unwrap()
    }

    async fn export(sql: &str) -> Plan {
        to_substrait_plan(&analyzed(sql).await).unwrap()
    }

    fn root(plan: &Plan) -> &RelRoot {
        match plan.relations[0].rel_type.as_ref().unwrap() {
            plan_rel::RelType::Root(r) => r,
            other => panic!("not a root: {other:?}"),
        }
    }

    /// Every expression and relation of `plan`'s tree, through its ProtoJSON.
    fn json(plan: &Plan) -> serde_json::Value {
        serde_json::to_value(plan).unwrap()
    }

    fn count_key(v: &serde_json::Value, key: &str) -> usize {
        match v {
            serde_json::Value::Object(o) => {
                usize::from(o.contains_key(key))
                    + o.values().map(|v| count_key(v, key)).sum::<usize>()
            }
            serde_json::Value::Array(a) => a.iter().map(|v| count_key(v, key)).sum(),
            _ => 0,
        }
    }

    /// Every call (scalar, window, aggregate) in `v` without an output type.
    fn untyped_calls(v: &serde_json::Value) -> usize {
        match v {
            serde_json::Value::Object(o) => {
                let call = ["scalarFunction", "windowFunction", "measure"]
                    .iter()
                    .filter_map(|k| o.get(*k))
                    .filter(|c| c.get("outputType").is_none())
                    .count();
                call + o.values().map(untyped_calls).sum::<usize>()
            }
            serde_json::Value::Array(a) => a.iter().map(untyped_calls).sum(),
            _ => 0,
        }
    }

    #[tokio::test]
    async fn every_call_has_an_output_type() {
        let plan = export(
            "SELECT id, count(*) AS n, sum(score), row_number() OVER (ORDER BY id) \
             FROM docs WHERE body NOT LIKE '%x%' AND id NOT IN ('a', 'b') \
             AND NOT EXISTS (SELECT 1 FROM topics WHERE topics.name = 'z') GROUP BY id",
        )
        .await;
        let json = json(&plan);
        assert!(count_key(&json, "measure") >= 2, "{json}");
        assert!(count_key(&json, "windowFunction") >= 1, "{json}");
        assert_eq!(untyped_calls(&json), 0, "{json:#}");
    }

    #[tokio::test]
    async fn functions_are_declared_under_their_extensions() {
        let plan = export(
            "SELECT id FROM docs WHERE ai_filter('Is {0} kind?', body) AND score > 2 \
             AND strpos(body, 'a') > 0",
        )
        .await;
        let urns: HashMap<u32, &str> = plan
            .extension_urns
            .iter()
            .map(|u| (u.extension_urn_anchor, u.urn.as_str()))
            .collect();
        let mut declared: Vec<(String, &str)> = plan
            .extensions
            .iter()
            .map(|d| match d.mapping_type.as_ref().unwrap() {
                datafusion_substrait::substrait::proto::extensions::simple_extension_declaration::MappingType::ExtensionFunction(f) => {
                    assert_ne!(f.function_anchor, 0);
                    (f.name.clone(), urns[&f.extension_urn_reference])
                }
                other => panic!("{other:?}"),
            })
            .collect();
        declared.sort();
        assert_eq!(
            declared,
            [
                ("ai_filter".to_string(), crate::exec::ai_functions::AI_URN),
                (
                    "and".to_string(),
                    "extension:io.substrait:functions_boolean"
                ),
                (
                    "gt".to_string(),
                    "extension:io.substrait:functions_comparison"
                ),
                (
                    "strpos".to_string(),
                    "extension:io.substrait:functions_string"
                ),
            ]
        );
        assert_eq!(root(&plan).names, ["id"]);
        assert_eq!(plan.version.as_ref().unwrap().producer, "aisql");
    }

    fn input_rel(plan: &Plan) -> &Rel {
        root(plan).input.as_ref().unwrap()
    }

    /// The first relation of kind `pick` under `rel`, depth first.
    fn find<'a, T>(rel: &'a Rel, pick: &impl Fn(&'a RelType) -> Option<&'a T>) -> Option<&'a T> {
        let kind = rel.rel_type.as_ref()?;
        if let Some(t) = pick(kind) {
            return Some(t);
        }
        let children: Vec<&Rel> = match kind {
            RelType::Project(p) => p.input.iter().map(|r| r.as_ref()).collect(),
            RelType::Filter(f) => f.input.iter().map(|r| r.as_ref()).collect(),
            RelType::Join(j) => j
                .left
                .iter()
                .chain(j.right.iter())
                .map(|r| r.as_ref())
                .collect(),
            RelType::Cross(c) => c
                .left
                .iter()
                .chain(c.right.iter())
                .map(|r| r.as_ref())
                .collect(),
            _ => Vec::new(),
        };
        children.into_iter().find_map(|c| find(c, pick))
    }

    #[tokio::test]
    async fn joins_have_conditions() {
        let plan = export("SELECT d.id FROM docs d, topics t WHERE d.body = t.name").await;
        assert!(
            find(input_rel(&plan), &|k| match k {
                RelType::Cross(c) => Some(c.as_ref()),
                _ => None,
            })
            .is_some()
        );
        let plan = export("SELECT d.id FROM docs d LEFT JOIN topics t ON true").await;
        let join = find(input_rel(&plan), &|k| match k {
            RelType::Join(j) => Some(j.as_ref()),
            _ => None,
        })
        .expect("a join");
        assert!(matches!(
            join.expression.as_deref(),
            Some(Expression {
                rex_type: Some(RexType::Literal(_))
            })
        ));
    }

    #[tokio::test]
    async fn a_simple_case_is_written_searched_and_lists_as_literals() {
        let plan = export(
            "SELECT CASE ai_classify('Topic of {0}?', body, ['a', 'b'], ['', '']) \
             WHEN 'a' THEN 1 ELSE 0 END FROM docs",
        )
        .await;
        let json = json(&plan);
        let ifs = count_key(&json, "ifs");
        assert_eq!(ifs, 1);
        assert_eq!(
            json.to_string().matches("\"then\"").count(),
            1,
            "every clause has a then: {json:#}"
        );
        let names: Vec<&str> = plan
            .extensions
            .iter()
            .map(|d| match d.mapping_type.as_ref().unwrap() {
                datafusion_substrait::substrait::proto::extensions::simple_extension_declaration::MappingType::ExtensionFunction(f) => f.name.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(!names.contains(&"make_array"), "{names:?}");
        assert!(names.contains(&"equal"), "{names:?}");
    }

    #[tokio::test]
    async fn in_list_options_are_as_nullable_as_the_value() {
        for sql in [
            "SELECT id FROM docs WHERE score IN (1.5, 2.5)",
            "SELECT id FROM docs WHERE score NOT IN (1.5, 2.5)",
        ] {
            let json = json(&export(sql).await).to_string();
            assert_eq!(
                json.matches("\"nullable\":true").count(),
                2,
                "{sql}: {json}"
            );
        }
    }

    #[tokio::test]
    async fn one_column_reads_stay_records() {
        // Only the optimizer prunes a read's columns (correlated subqueries are
        // exported optimized).
        let state = SessionContext::new().state();
        let optimized = state
            .optimizer()
            .optimize(analyzed("SELECT id FROM docs").await, &state, |_, _| {})
            .unwrap();
        let plan = to_substrait_plan(&optimized).unwrap();
        let read = find(input_rel(&plan), &|k| match k {
            RelType::Read(r) => Some(r.as_ref()),
            _ => None,
        })
        .expect("a read");
        assert!(read.projection.as_ref().unwrap().maintain_singular_struct);
    }

    #[tokio::test]
    async fn exports_read_back_into_datafusion() {
        let sql = "SELECT d.id, t.id FROM docs d JOIN topics t ON d.body = t.name";
        let plan = export(sql).await;
        let ctx = SessionContext::new();
        create_tables(&ctx).await;
        let decoded = <Plan as prost::Message>::decode(encode(&plan).as_slice()).unwrap();
        assert_eq!(decoded, plan);
        let consumed = datafusion_substrait::logical_plan::consumer::from_substrait_plan(
            &ctx.state(),
            &decoded,
        )
        .await
        .unwrap();
        let names: Vec<String> = consumed
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["d.id", "t.id"]);
    }
}
