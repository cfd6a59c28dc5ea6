//! QUAIL-B plan files: loading (ProtoJSON or binary protobuf), the version and
//! extension checks, and the query IR the rest of the engine reasons about.
//!
//! DataFusion executes the plan (see [`crate::logical`]); this module reads the
//! same Substrait plan once more into a small, validated description of the query
//! (relations, AI operators in post-order, selected columns) following SPEC §A.
//! Operator ids, prompt pieces, token accounting, `explain` and the definition
//! hash all come from here, so they never depend on how DataFusion rewrites the
//! plan. Extension functions are resolved by name and URN, never by anchor.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use datafusion_substrait::substrait::proto::{
    self, Expression, Plan, Rel, RelCommon, expression::RexType, extensions,
    function_argument::ArgType, plan_rel, read_rel, rel, rel_common,
};
use prost::Message;
use serde_json::json;

use crate::error::{EngineError, Result};

/// The Substrait version QUAIL-B plans are written with.
pub const SUBSTRAIT_VERSION: (u32, u32, u32) = (0, 103, 0);
/// URN of the AI functions.
pub const AI_URN: &str = "extension:org.fsdatalab.quail_b:functions_ai";
/// URN of `equal`.
pub const COMPARISON_URN: &str = "extension:io.substrait:functions_comparison";
/// URN of `and`.
pub const BOOLEAN_URN: &str = "extension:io.substrait:functions_boolean";

/// A relation (one scan under one alias).
#[derive(Debug, Clone, PartialEq)]
pub struct Relation {
    /// Alias from the read's hint (`r`, `a2`, …).
    pub alias: String,
    /// Physical table name.
    pub table: String,
    /// Columns the read declares (`id`, text column, extras).
    pub columns: Vec<String>,
    /// The one column AI functions read.
    pub text_column: String,
}

/// One AI operator or IN-list, in post-order.
#[derive(Debug, Clone, PartialEq)]
pub enum Operator {
    /// `ai_filter(template, alias.text)`.
    Filter {
        /// `filter-N`.
        id: String,
        /// Relation filtered.
        alias: String,
        /// Prompt template with `{0}`.
        template: String,
    },
    /// `ai_join(template, {0}, {1})` with optional equality conjuncts.
    Join {
        /// `join-N`.
        id: String,
        /// Aliases of the `{0}` and `{1}` documents (placeholder order).
        aliases: [String; 2],
        /// Prompt template with `{0}` and `{1}`.
        template: String,
        /// Equality conditions as (column of `{0}`'s alias, column of `{1}`'s alias).
        on: Vec<(String, String)>,
    },
    /// `ai_classify(template, anchor[, partner], labels, descriptions)`.
    Classify {
        /// `classify-N`.
        id: String,
        /// Anchor alias (`{0}`); the label column belongs to it.
        alias: String,
        /// Partner alias (`{1}`) for a joined-row classification.
        partner: Option<String>,
        /// Prompt template.
        template: String,
        /// Labels in tie-break order.
        labels: Vec<String>,
        /// One description per label ("" = none).
        descriptions: Vec<String>,
        /// Output label column name (bare, e.g. `sentiment`).
        output: String,
    },
    /// IN-list on a label column (asks no model).
    InList {
        /// `in-list-N`.
        id: String,
        /// Relation the label column belongs to.
        alias: String,
        /// Label column tested.
        output: String,
        /// Labels kept.
        accepted: Vec<String>,
    },
}

impl Operator {
    /// The operator id (`filter-1`, …).
    pub fn id(&self) -> &str {
        match self {
            Operator::Filter { id, .. }
            | Operator::Join { id, .. }
            | Operator::Classify { id, .. }
            | Operator::InList { id, .. } => id,
        }
    }

    /// The template of an AI operator (None for IN-lists).
    pub fn template(&self) -> Option<&str> {
        match self {
            Operator::Filter { template, .. }
            | Operator::Join { template, .. }
            | Operator::Classify { template, .. } => Some(template),
            Operator::InList { .. } => None,
        }
    }
}

/// A selected output column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// Relation alias.
    pub alias: String,
    /// Column: `id` or a label column.
    pub column: String,
    /// Output name (alias for ids, bare column for labels).
    pub name: String,
}

/// A decoded, validated QUAIL-B query.
#[derive(Debug, Clone)]
pub struct QueryPlan {
    /// The Substrait plan as decoded.
    pub substrait: Plan,
    /// Declared functions as (urn, compound name), sorted.
    pub functions: Vec<(String, String)>,
    /// Relations in scan (post-)order.
    pub relations: Vec<Relation>,
    /// AI operators and IN-lists in post-order.
    pub operators: Vec<Operator>,
    /// Output columns in order.
    pub select: Vec<Selected>,
}

/// Reads a plan file: `.json` as Substrait ProtoJSON, `.substrait`/`.pb` (or
/// anything else) as binary protobuf.
pub fn read_plan_file(path: &Path) -> Result<Plan> {
    let bytes = std::fs::read(path).map_err(|e| EngineError::io(path, e))?;
    let is_json = path.extension().is_some_and(|e| e == "json");
    decode_plan(&bytes, is_json).map_err(|message| EngineError::PlanFile {
        path: path.display().to_string(),
        message,
    })
}

/// Decodes plan bytes as ProtoJSON (`json = true`) or binary protobuf.
pub fn decode_plan(bytes: &[u8], json: bool) -> std::result::Result<Plan, String> {
    if json {
        let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
        serde_json::from_str::<Plan>(text).map_err(|e| format!("malformed Substrait JSON: {e}"))
    } else {
        Plan::decode(bytes).map_err(|e| format!("malformed Substrait protobuf: {e}"))
    }
}

/// Serializes a plan as binary protobuf (the `plan.substrait` output file).
pub fn encode_plan(plan: &Plan) -> Vec<u8> {
    plan.encode_to_vec()
}

fn invalid(msg: impl Into<String>) -> EngineError {
    EngineError::InvalidPlan(msg.into())
}

/// A declared extension function.
#[derive(Debug, Clone)]
struct Function {
    /// Compound name, e.g. `ai_filter:str_str`.
    name: String,
    urn: String,
}

impl Function {
    fn base(&self) -> &str {
        self.name.split(':').next().unwrap_or(&self.name)
    }
}

/// What an AI or boolean function is, after checking name, URN and signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FunctionKind {
    AiFilter,
    AiJoin,
    AiClassify1,
    AiClassify2,
    Equal,
    And,
}

fn classify_function(f: &Function) -> Result<FunctionKind> {
    let (kind, urn) = match f.base() {
        "ai_filter" => (FunctionKind::AiFilter, AI_URN),
        "ai_join" => (FunctionKind::AiJoin, AI_URN),
        "ai_classify" if f.name == "ai_classify:str_str_str_list_list" => {
            (FunctionKind::AiClassify2, AI_URN)
        }
        "ai_classify" => (FunctionKind::AiClassify1, AI_URN),
        "equal" => (FunctionKind::Equal, COMPARISON_URN),
        "and" => (FunctionKind::And, BOOLEAN_URN),
        other => {
            return Err(invalid(format!(
                "unknown function {other:?} (declared as {:?} under {})",
                f.name, f.urn
            )));
        }
    };
    if f.urn != urn {
        return Err(invalid(format!(
            "function {:?} is declared under URN {:?}, expected {urn:?}",
            f.name, f.urn
        )));
    }
    Ok(kind)
}

/// A column of the field list: (alias, column).
type Field = (String, String);

struct Reader {
    functions: HashMap<u32, Function>,
    relations: Vec<Relation>,
    operators: Vec<Operator>,
    /// Per alias, the text column AI functions use.
    text_columns: HashMap<String, String>,
    /// Per kind prefix, number of operators seen (for ids without hints).
    counters: HashMap<&'static str, usize>,
    /// Label columns: (alias, column) -> classify id.
    label_columns: HashMap<Field, String>,
}

impl QueryPlan {
    /// Reads and validates a plan file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let plan = read_plan_file(path)?;
        Self::from_substrait(plan).map_err(|e| match e {
            EngineError::InvalidPlan(m) => EngineError::PlanFile {
                path: path.display().to_string(),
                message: m,
            },
            other => other,
        })
    }

    /// Validates a decoded plan and derives the query description.
    pub fn from_substrait(plan: Plan) -> Result<Self> {
        let version = plan
            .version
            .as_ref()
            .ok_or_else(|| invalid("no Substrait version (expected 0.103.0)"))?;
        let got = (
            version.major_number,
            version.minor_number,
            version.patch_number,
        );
        if got != SUBSTRAIT_VERSION {
            return Err(invalid(format!(
                "Substrait version {}.{}.{} is not supported (expected 0.103.0)",
                got.0, got.1, got.2
            )));
        }
        let urns: HashMap<u32, String> = plan
            .extension_urns
            .iter()
            .map(|u| (u.extension_urn_anchor, u.urn.clone()))
            .collect();
        let mut functions = HashMap::new();
        for ext in &plan.extensions {
            let Some(extensions::simple_extension_declaration::MappingType::ExtensionFunction(f)) =
                &ext.mapping_type
            else {
                continue;
            };
            let urn = urns
                .get(&f.extension_urn_reference)
                .ok_or_else(|| {
                    invalid(format!(
                        "function {:?} refers to undeclared URN anchor {}",
                        f.name, f.extension_urn_reference
                    ))
                })?
                .clone();
            let function = Function {
                name: f.name.clone(),
                urn,
            };
            classify_function(&function)?;
            if functions.insert(f.function_anchor, function).is_some() {
                return Err(invalid(format!(
                    "function anchor {} is declared twice",
                    f.function_anchor
                )));
            }
        }
        let mut declared: Vec<(String, String)> = functions
            .values()
            .map(|f| (f.urn.clone(), f.name.clone()))
            .collect();
        declared.sort();

        if plan.relations.len() != 1 {
            return Err(invalid(format!(
                "expected exactly one relation (a root), found {}",
                plan.relations.len()
            )));
        }
        let Some(plan_rel::RelType::Root(root)) = &plan.relations[0].rel_type else {
            return Err(invalid("the plan's relation is not a root"));
        };
        let root_input = root
            .input
            .as_ref()
            .ok_or_else(|| invalid("the root has no input"))?;
        let Some(rel::RelType::Project(project)) = &root_input.rel_type else {
            return Err(invalid("the root's input is not a projection"));
        };

        let mut reader = Reader {
            functions,
            relations: Vec::new(),
            operators: Vec::new(),
            text_columns: HashMap::new(),
            counters: HashMap::new(),
            label_columns: HashMap::new(),
        };
        let input = project
            .input
            .as_deref()
            .ok_or_else(|| invalid("the root projection has no input"))?;
        let fields = reader.rel(input)?;
        let select = reader.root_projection(project, &fields, &root.names)?;
        let mut query = QueryPlan {
            substrait: plan.clone(),
            functions: declared,
            relations: reader.relations,
            operators: reader.operators,
            select,
        };
        for r in &mut query.relations {
            r.text_column = reader.text_columns.get(&r.alias).cloned().ok_or_else(|| {
                invalid(format!("relation {} is read by no AI function", r.alias))
            })?;
        }
        query.validate()?;
        Ok(query)
    }

    /// The relation of an alias.
    pub fn relation(&self, alias: &str) -> Option<&Relation> {
        self.relations.iter().find(|r| r.alias == alias)
    }

    /// The operator with an id.
    pub fn operator(&self, id: &str) -> Option<&Operator> {
        self.operators.iter().find(|o| o.id() == id)
    }

    /// Output column names (SPEC §A.7).
    pub fn output_names(&self) -> Vec<String> {
        self.select.iter().map(|s| s.name.clone()).collect()
    }

    /// Templates of every AI operator, in post-order, without repeats.
    pub fn templates(&self) -> Vec<String> {
        let mut seen = HashSet::new();
        self.operators
            .iter()
            .filter_map(|o| o.template())
            .filter(|t| seen.insert(t.to_string()))
            .map(str::to_string)
            .collect()
    }

    /// Tables scanned, without repeats, in scan order.
    pub fn tables(&self) -> Vec<String> {
        let mut seen = HashSet::new();
        self.relations
            .iter()
            .filter(|r| seen.insert(r.table.clone()))
            .map(|r| r.table.clone())
            .collect()
    }

    fn validate(&self) -> Result<()> {
        let joins = self
            .operators
            .iter()
            .filter(|o| matches!(o, Operator::Join { .. }))
            .count();
        if self.relations.len() != joins + 1 {
            return Err(invalid(format!(
                "{} relations need {} joins, found {joins}",
                self.relations.len(),
                self.relations.len() - 1
            )));
        }
        let mut labels = HashSet::new();
        for o in &self.operators {
            if let Operator::Classify { output, id, .. } = o
                && (!labels.insert(output.clone()) || self.relation(output).is_some())
            {
                return Err(invalid(format!(
                    "{id}: label column {output:?} repeats another label column or an alias"
                )));
            }
        }
        // Every label column must be used: selected or tested by an IN-list.
        for o in &self.operators {
            if let Operator::Classify {
                id, alias, output, ..
            } = o
            {
                let selected = self
                    .select
                    .iter()
                    .any(|s| &s.alias == alias && &s.column == output);
                let tested = self.operators.iter().any(
                    |x| matches!(x, Operator::InList { alias: a, output: c, .. } if a == alias && c == output),
                );
                if !selected && !tested {
                    return Err(invalid(format!(
                        "{id}: label column {alias}.{output} is neither selected nor tested"
                    )));
                }
            }
        }
        // A selected label column needs its relation's id (both for a joined-row label).
        for s in &self.select {
            if s.column == "id" {
                continue;
            }
            let needs: Vec<&str> = match self.operators.iter().find(
                |o| matches!(o, Operator::Classify { alias, output, .. } if *alias == s.alias && *output == s.column),
            ) {
                Some(Operator::Classify { alias, partner, .. }) => {
                    let mut v = vec![alias.as_str()];
                    v.extend(partner.as_deref());
                    v
                }
                _ => vec![s.alias.as_str()],
            };
            for alias in needs {
                if !self
                    .select
                    .iter()
                    .any(|x| x.alias == alias && x.column == "id")
                {
                    return Err(invalid(format!(
                        "selected label column {}.{} needs {alias}.id selected too",
                        s.alias, s.column
                    )));
                }
            }
        }
        Ok(())
    }

    /// SHA-256 hex of the canonical JSON query definition (SPEC §D.6).
    pub fn definition_hash(&self, prompt_format: &str) -> String {
        let operators: Vec<serde_json::Value> = self
            .operators
            .iter()
            .map(|o| match o {
                Operator::Filter {
                    id,
                    alias,
                    template,
                } => json!({"kind": "filter", "id": id, "relation": alias, "prompt": template}),
                Operator::Join {
                    id,
                    aliases,
                    template,
                    on,
                } => json!({"kind": "join", "id": id, "relations": aliases, "prompt": template,
                    "on": on.iter().map(|(a, b)| vec![a, b]).collect::<Vec<_>>()}),
                Operator::Classify {
                    id,
                    alias,
                    partner,
                    template,
                    labels,
                    descriptions,
                    output,
                } => {
                    let mut v = json!({"kind": "classify", "id": id, "relation": alias, "prompt": template,
                        "labels": labels, "descriptions": descriptions, "output": output});
                    if let Some(p) = partner {
                        v["partner"] = json!(p);
                    }
                    v
                }
                Operator::InList {
                    id,
                    alias,
                    output,
                    accepted,
                } => json!({"kind": "label_filter", "id": id, "relation": alias, "output": output, "accepted": accepted}),
            })
            .collect();
        let mut def = json!({
            "substrait_version": [SUBSTRAIT_VERSION.0, SUBSTRAIT_VERSION.1, SUBSTRAIT_VERSION.2],
            "functions": self.functions.iter().map(|(u, n)| vec![u, n]).collect::<Vec<_>>(),
            "relations": self.relations.iter().map(|r| json!({"alias": r.alias, "table": r.table, "text_column": r.text_column})).collect::<Vec<_>>(),
            "operators": operators,
            "select": self.select.iter().map(|s| format!("{}.{}", s.alias, s.column)).collect::<Vec<_>>(),
        });
        if prompt_format != "raw-v1" {
            def["prompt_format"] = json!(prompt_format);
        }
        crate::canonical::sha256_hex(&def)
    }
}

impl Reader {
    fn next_id(&mut self, common: Option<&RelCommon>, prefix: &'static str) -> Result<String> {
        let n = self.counters.entry(prefix).or_insert(0);
        *n += 1;
        let expected = format!("{prefix}-{n}");
        match hint_alias(common) {
            None => Ok(expected),
            Some(id) if id == expected => Ok(id),
            // The 42-query line named IN-lists label-filter-N.
            Some(id) if prefix == "in-list" && id == format!("label-filter-{n}") => Ok(id),
            Some(id) => Err(invalid(format!(
                "operator id {id:?} breaks post-order numbering (expected {expected:?})"
            ))),
        }
    }

    fn rel(&mut self, rel: &Rel) -> Result<Vec<Field>> {
        match rel.rel_type.as_ref() {
            Some(rel::RelType::Read(read)) => self.read(read),
            Some(rel::RelType::Filter(filter)) => {
                let input = filter
                    .input
                    .as_deref()
                    .ok_or_else(|| invalid("a filter has no input"))?;
                let fields = self.rel(input)?;
                let condition = filter
                    .condition
                    .as_deref()
                    .ok_or_else(|| invalid("a filter has no condition"))?;
                self.filter(filter.common.as_ref(), condition, &fields)?;
                Ok(fields)
            }
            Some(rel::RelType::Join(join)) => {
                let left = self.rel(
                    join.left
                        .as_deref()
                        .ok_or_else(|| invalid("a join has no left input"))?,
                )?;
                let right = self.rel(
                    join.right
                        .as_deref()
                        .ok_or_else(|| invalid("a join has no right input"))?,
                )?;
                if join.r#type != proto::join_rel::JoinType::Inner as i32 {
                    return Err(invalid("only inner joins are supported"));
                }
                if join.post_join_filter.is_some() {
                    return Err(invalid("post-join filters are not supported"));
                }
                let mut fields = left.clone();
                fields.extend(right.iter().cloned());
                let expression = join
                    .expression
                    .as_deref()
                    .ok_or_else(|| invalid("a join has no condition"))?;
                self.join(join.common.as_ref(), expression, &fields, &left, &right)?;
                Ok(fields)
            }
            Some(rel::RelType::Project(project)) => {
                let input = project
                    .input
                    .as_deref()
                    .ok_or_else(|| invalid("a projection has no input"))?;
                let mut fields = self.rel(input)?;
                if project.expressions.len() != 1 {
                    return Err(invalid(format!(
                        "a classification projection must add exactly one expression, found {}",
                        project.expressions.len()
                    )));
                }
                let field =
                    self.classify(project.common.as_ref(), &project.expressions[0], &fields)?;
                fields.push(field);
                Ok(fields)
            }
            Some(other) => Err(invalid(format!("unsupported relation {}", rel_name(other)))),
            None => Err(invalid("a relation has no type")),
        }
    }

    fn read(&mut self, read: &proto::ReadRel) -> Result<Vec<Field>> {
        let table = match &read.read_type {
            Some(read_rel::ReadType::NamedTable(t)) if t.names.len() == 1 => t.names[0].clone(),
            _ => return Err(invalid("a read must name exactly one table")),
        };
        let alias = hint_alias(read.common.as_ref())
            .ok_or_else(|| invalid(format!("the read of table {table} has no alias hint")))?;
        if self.relations.iter().any(|r| r.alias == alias) {
            return Err(invalid(format!("alias {alias:?} is used twice")));
        }
        let schema = read
            .base_schema
            .as_ref()
            .ok_or_else(|| invalid(format!("the read of {table} has no base schema")))?;
        if schema.names.first().map(String::as_str) != Some("id") {
            return Err(invalid(format!(
                "the read of {table} must list `id` first, found {:?}",
                schema.names
            )));
        }
        self.relations.push(Relation {
            alias: alias.clone(),
            table,
            columns: schema.names.clone(),
            text_column: String::new(),
        });
        Ok(schema
            .names
            .iter()
            .map(|n| (alias.clone(), n.clone()))
            .collect())
    }

    fn function_of<'e>(
        &self,
        e: &'e Expression,
    ) -> Option<(FunctionKind, &'e proto::expression::ScalarFunction)> {
        match e.rex_type.as_ref()? {
            RexType::ScalarFunction(f) => {
                let decl = self.functions.get(&f.function_reference)?;
                classify_function(decl).ok().map(|k| (k, f))
            }
            _ => None,
        }
    }

    fn call<'a>(
        &self,
        e: &'a Expression,
        what: &str,
    ) -> Result<(FunctionKind, Vec<&'a Expression>)> {
        let Some(RexType::ScalarFunction(f)) = e.rex_type.as_ref() else {
            return Err(invalid(format!("{what}: expected a function call")));
        };
        let decl = self.functions.get(&f.function_reference).ok_or_else(|| {
            invalid(format!(
                "{what}: function anchor {} is not declared",
                f.function_reference
            ))
        })?;
        let kind = classify_function(decl)?;
        let args = f
            .arguments
            .iter()
            .map(|a| match &a.arg_type {
                Some(ArgType::Value(v)) => Ok(v),
                _ => Err(invalid(format!(
                    "{what}: {} has a non-value argument",
                    decl.name
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let expected = match kind {
            FunctionKind::AiFilter => 2,
            FunctionKind::AiJoin => 3,
            FunctionKind::AiClassify1 => 4,
            FunctionKind::AiClassify2 => 5,
            FunctionKind::Equal => 2,
            FunctionKind::And => args.len().max(1),
        };
        if args.len() != expected {
            return Err(invalid(format!(
                "{what}: {} takes {expected} arguments, got {}",
                decl.base(),
                args.len()
            )));
        }
        Ok((kind, args))
    }

    fn text_field(&mut self, e: &Expression, fields: &[Field], what: &str) -> Result<String> {
        let (alias, column) = field_ref(e, fields, what)?;
        match self.text_columns.get(&alias) {
            Some(c) if *c != column => Err(invalid(format!(
                "{what}: relation {alias} is read through two text columns ({c}, {column})"
            ))),
            _ => {
                self.text_columns.insert(alias.clone(), column);
                Ok(alias)
            }
        }
    }

    fn filter(
        &mut self,
        common: Option<&RelCommon>,
        cond: &Expression,
        fields: &[Field],
    ) -> Result<()> {
        if let Some(RexType::SingularOrList(list)) = cond.rex_type.as_ref() {
            let id = self.next_id(common, "in-list")?;
            let value = list
                .value
                .as_deref()
                .ok_or_else(|| invalid(format!("{id}: IN-list without a value")))?;
            let (alias, output) = field_ref(value, fields, &id)?;
            let classify_id = self
                .label_columns
                .get(&(alias.clone(), output.clone()))
                .cloned()
                .ok_or_else(|| {
                    invalid(format!(
                        "{id}: {alias}.{output} is not the label column of a classification"
                    ))
                })?;
            let labels = match self.operators.iter().find(|o| o.id() == classify_id) {
                Some(Operator::Classify {
                    labels, partner, ..
                }) => {
                    if partner.is_some() {
                        return Err(invalid(format!(
                            "{id}: IN-lists apply to one-document classifications only"
                        )));
                    }
                    labels.clone()
                }
                _ => unreachable!("label columns map to classifications"),
            };
            let mut accepted = Vec::new();
            for o in &list.options {
                let s = string_literal(o, &id)?;
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
            return Ok(());
        }
        let id = self.next_id(common, "filter")?;
        let (kind, args) = self.call(cond, &id)?;
        if kind != FunctionKind::AiFilter {
            return Err(invalid(format!(
                "{id}: a filter condition must call ai_filter"
            )));
        }
        let template = string_literal(args[0], &id)?;
        check_placeholders(&template, 1, &id)?;
        let alias = self.text_field(args[1], fields, &id)?;
        self.operators.push(Operator::Filter {
            id,
            alias,
            template,
        });
        Ok(())
    }

    fn join(
        &mut self,
        common: Option<&RelCommon>,
        cond: &Expression,
        fields: &[Field],
        left: &[Field],
        right: &[Field],
    ) -> Result<()> {
        let id = self.next_id(common, "join")?;
        // Flatten nested `and`.
        let mut conjuncts = Vec::new();
        let mut stack = vec![cond];
        while let Some(e) = stack.pop() {
            match self.function_of(e) {
                Some((FunctionKind::And, _)) => {
                    let (_, args) = self.call(e, &id)?;
                    stack.extend(args.into_iter().rev());
                }
                _ => conjuncts.push(e),
            }
        }
        let mut ai = None;
        let mut equalities = Vec::new();
        for c in conjuncts {
            let (kind, args) = self.call(c, &id)?;
            match kind {
                FunctionKind::AiJoin if ai.is_none() => ai = Some(args),
                FunctionKind::AiJoin => {
                    return Err(invalid(format!("{id}: a join may call ai_join only once")));
                }
                FunctionKind::Equal => {
                    let a = field_ref(args[0], fields, &id)?;
                    let b = field_ref(args[1], fields, &id)?;
                    equalities.push((a, b));
                }
                _ => {
                    return Err(invalid(format!(
                        "{id}: join conditions may only combine ai_join with equalities"
                    )));
                }
            }
        }
        let args = ai.ok_or_else(|| invalid(format!("{id}: the join calls no ai_join")))?;
        let template = string_literal(args[0], &id)?;
        check_placeholders(&template, 2, &id)?;
        let a0 = self.text_field(args[1], fields, &id)?;
        let a1 = self.text_field(args[2], fields, &id)?;
        let side = |alias: &str| -> Option<bool> {
            if left.iter().any(|(a, _)| a == alias) {
                Some(true)
            } else if right.iter().any(|(a, _)| a == alias) {
                Some(false)
            } else {
                None
            }
        };
        if side(&a0) == side(&a1) {
            return Err(invalid(format!(
                "{id}: ai_join documents {a0} and {a1} must come from different join inputs"
            )));
        }
        let mut on = Vec::new();
        for ((x_alias, x_col), (y_alias, y_col)) in equalities {
            if x_alias == a0 && y_alias == a1 {
                on.push((x_col, y_col));
            } else if x_alias == a1 && y_alias == a0 {
                on.push((y_col, x_col));
            } else {
                return Err(invalid(format!(
                    "{id}: equality {x_alias}.{x_col} = {y_alias}.{y_col} must compare the two ai_join relations"
                )));
            }
        }
        self.operators.push(Operator::Join {
            id,
            aliases: [a0, a1],
            template,
            on,
        });
        Ok(())
    }

    fn classify(
        &mut self,
        common: Option<&RelCommon>,
        e: &Expression,
        fields: &[Field],
    ) -> Result<Field> {
        let id = self.next_id(common, "classify")?;
        let (kind, args) = self.call(e, &id)?;
        let (alias, partner, rest) = match kind {
            FunctionKind::AiClassify1 => (self.text_field(args[1], fields, &id)?, None, &args[2..]),
            FunctionKind::AiClassify2 => {
                let a = self.text_field(args[1], fields, &id)?;
                let p = self.text_field(args[2], fields, &id)?;
                (a, Some(p), &args[3..])
            }
            _ => {
                return Err(invalid(format!("{id}: a projection must call ai_classify")));
            }
        };
        let template = string_literal(args[0], &id)?;
        check_placeholders(&template, if partner.is_some() { 2 } else { 1 }, &id)?;
        let labels = string_list(rest[0], &id)?;
        let descriptions = string_list(rest[1], &id)?;
        check_labels(&labels, &descriptions, &id)?;
        let output_names = common
            .and_then(|c| c.hint.as_ref())
            .map(|h| h.output_names.clone())
            .unwrap_or_default();
        let last = output_names
            .last()
            .ok_or_else(|| invalid(format!("{id}: no output name hint for the label column")))?;
        let (owner, output) = last
            .split_once('.')
            .ok_or_else(|| invalid(format!("{id}: output name {last:?} is not alias.column")))?;
        if owner != alias {
            return Err(invalid(format!(
                "{id}: label column {last} must belong to the anchor alias {alias}"
            )));
        }
        let field = (alias.clone(), output.to_string());
        self.label_columns.insert(field.clone(), id.clone());
        self.operators.push(Operator::Classify {
            id,
            alias,
            partner,
            template,
            labels,
            descriptions,
            output: output.to_string(),
        });
        Ok(field)
    }

    fn root_projection(
        &mut self,
        project: &proto::ProjectRel,
        fields: &[Field],
        names: &[String],
    ) -> Result<Vec<Selected>> {
        let mut all: Vec<Field> = fields.to_vec();
        for e in &project.expressions {
            all.push(field_ref(e, fields, "root projection")?);
        }
        let mapping: Vec<usize> = match project.common.as_ref().and_then(|c| c.emit_kind.as_ref()) {
            Some(rel_common::EmitKind::Emit(emit)) => emit
                .output_mapping
                .iter()
                .map(|&i| {
                    usize::try_from(i)
                        .ok()
                        .filter(|&i| i < all.len())
                        .ok_or_else(|| invalid(format!("root output mapping {i} is out of range")))
                })
                .collect::<Result<_>>()?,
            _ => (0..all.len()).collect(),
        };
        let mut select = Vec::new();
        for i in mapping {
            let (alias, column) = all[i].clone();
            let name = if column == "id" {
                alias.clone()
            } else {
                column.clone()
            };
            if column != "id"
                && !self
                    .label_columns
                    .contains_key(&(alias.clone(), column.clone()))
            {
                return Err(invalid(format!(
                    "root selects {alias}.{column}, which is neither an id nor a label column"
                )));
            }
            select.push(Selected {
                alias,
                column,
                name,
            });
        }
        if !names.is_empty() && names.len() != select.len() {
            return Err(invalid(format!(
                "the root names {} columns but selects {}",
                names.len(),
                select.len()
            )));
        }
        for (s, n) in select.iter().zip(names) {
            if &s.name != n {
                return Err(invalid(format!(
                    "root column {n:?} should be named {:?} (SPEC §A.7)",
                    s.name
                )));
            }
        }
        Ok(select)
    }
}

fn hint_alias(common: Option<&RelCommon>) -> Option<String> {
    common
        .and_then(|c| c.hint.as_ref())
        .map(|h| h.alias.clone())
        .filter(|a| !a.is_empty())
}

fn rel_name(r: &rel::RelType) -> &'static str {
    match r {
        rel::RelType::Read(_) => "read",
        rel::RelType::Filter(_) => "filter",
        rel::RelType::Fetch(_) => "fetch",
        rel::RelType::Aggregate(_) => "aggregate",
        rel::RelType::Sort(_) => "sort",
        rel::RelType::Join(_) => "join",
        rel::RelType::Project(_) => "project",
        rel::RelType::Set(_) => "set",
        rel::RelType::Cross(_) => "cross",
        _ => "relation",
    }
}

fn field_ref(e: &Expression, fields: &[Field], what: &str) -> Result<Field> {
    use proto::expression::field_reference::ReferenceType;
    use proto::expression::reference_segment;
    let Some(RexType::Selection(sel)) = e.rex_type.as_ref() else {
        return Err(invalid(format!("{what}: expected a column reference")));
    };
    let Some(ReferenceType::DirectReference(seg)) = &sel.reference_type else {
        return Err(invalid(format!(
            "{what}: expected a direct column reference"
        )));
    };
    let Some(reference_segment::ReferenceType::StructField(f)) = &seg.reference_type else {
        return Err(invalid(format!(
            "{what}: expected a struct field reference"
        )));
    };
    usize::try_from(f.field)
        .ok()
        .and_then(|i| fields.get(i))
        .cloned()
        .ok_or_else(|| {
            invalid(format!(
                "{what}: field {} is out of range (the input has {} fields)",
                f.field,
                fields.len()
            ))
        })
}

fn string_literal(e: &Expression, what: &str) -> Result<String> {
    use proto::expression::literal::LiteralType;
    match e.rex_type.as_ref() {
        Some(RexType::Literal(proto::expression::Literal {
            literal_type: Some(LiteralType::String(s)),
            ..
        })) => Ok(s.clone()),
        _ => Err(invalid(format!("{what}: expected a string literal"))),
    }
}

fn string_list(e: &Expression, what: &str) -> Result<Vec<String>> {
    use proto::expression::literal::LiteralType;
    match e.rex_type.as_ref() {
        Some(RexType::Literal(proto::expression::Literal {
            literal_type: Some(LiteralType::List(list)),
            ..
        })) => list
            .values
            .iter()
            .map(|v| match &v.literal_type {
                Some(LiteralType::String(s)) => Ok(s.clone()),
                _ => Err(invalid(format!("{what}: list values must be strings"))),
            })
            .collect(),
        _ => Err(invalid(format!(
            "{what}: expected a list literal of strings"
        ))),
    }
}

fn check_placeholders(template: &str, n: usize, what: &str) -> Result<()> {
    crate::prompt::check_placeholders(template, n).map_err(|m| invalid(format!("{what}: {m}")))
}

fn fold(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

fn check_labels(labels: &[String], descriptions: &[String], what: &str) -> Result<()> {
    if labels.len() < 2 {
        return Err(invalid(format!(
            "{what}: a classification needs at least two labels"
        )));
    }
    if descriptions.len() != labels.len() {
        return Err(invalid(format!(
            "{what}: {} labels but {} descriptions",
            labels.len(),
            descriptions.len()
        )));
    }
    let folded: Vec<String> = labels.iter().map(|l| fold(l)).collect();
    let mut seen = BTreeMap::new();
    for (l, f) in labels.iter().zip(&folded) {
        if f.is_empty() {
            return Err(invalid(format!("{what}: empty label")));
        }
        if let Some(prev) = seen.insert(f.clone(), l) {
            return Err(invalid(format!(
                "{what}: labels {prev:?} and {l:?} are the same"
            )));
        }
    }
    for a in &folded {
        for b in &folded {
            if b.len() > a.len() && b.starts_with(a.as_str()) && b[a.len()..].starts_with(' ') {
                return Err(invalid(format!(
                    "{what}: label {b:?} continues label {a:?} word for word"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    pub(crate) fn plans_dir() -> PathBuf {
        // The repository's copy, which the bench crate embeds in the binary.
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/quailb/plans")
    }

    #[test]
    fn reads_every_catalog_plan() {
        let dir = plans_dir();
        let catalog: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(dir.join("catalog.json")).unwrap())
                .unwrap();
        assert_eq!(catalog.len(), 46);
        for q in &catalog {
            let id = q["id"].as_str().unwrap();
            let plan = QueryPlan::from_file(&dir.join(format!("{id}.json")))
                .unwrap_or_else(|e| panic!("{id}: {e}"));
            assert!(!plan.select.is_empty(), "{id}");
        }
    }

    #[test]
    fn fev8_keeps_placeholder_order_and_fev10_its_equality() {
        let dir = plans_dir();
        let fev8 = QueryPlan::from_file(&dir.join("FEV-8.json")).unwrap();
        match &fev8.operators[1] {
            Operator::Join { id, aliases, .. } => {
                assert_eq!(id, "join-2");
                assert_eq!(aliases, &["c2".to_string(), "e1".to_string()]);
            }
            o => panic!("{o:?}"),
        }
        assert_eq!(fev8.output_names(), ["c1", "e1", "c2", "e2"]);
        let fev10 = QueryPlan::from_file(&dir.join("FEV-10.json")).unwrap();
        let Operator::Join { on, .. } = fev10.operator("join-1").unwrap() else {
            panic!()
        };
        assert_eq!(on, &[("evidence_wiki_url".to_string(), "id".to_string())]);
    }

    #[test]
    fn imdb15_has_a_joined_row_classification() {
        let q = QueryPlan::from_file(&plans_dir().join("IMDB-15.json")).unwrap();
        let ids: Vec<&str> = q.operators.iter().map(|o| o.id()).collect();
        assert_eq!(ids, ["classify-1", "in-list-1", "join-1", "classify-2"]);
        let Operator::Classify {
            partner, output, ..
        } = q.operator("classify-2").unwrap()
        else {
            panic!()
        };
        assert_eq!(partner.as_deref(), Some("a"));
        assert_eq!(output, "aspect_sentiment");
        assert_eq!(
            q.output_names(),
            ["r", "sentiment", "a", "aspect_sentiment"]
        );
    }

    fn imdb1_json() -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(plans_dir().join("IMDB-1.json")).unwrap())
            .unwrap()
    }

    fn from_json(v: serde_json::Value) -> Result<QueryPlan> {
        let plan = decode_plan(v.to_string().as_bytes(), true).map_err(invalid)?;
        QueryPlan::from_substrait(plan)
    }

    #[test]
    fn rejects_wrong_version_unknown_function_and_bad_arity() {
        let mut v = imdb1_json();
        v["version"]["minor_number"] = json!(102);
        let e = from_json(v).unwrap_err().to_string();
        assert!(e.contains("0.102.0"), "{e}");

        let mut v = imdb1_json();
        v["extensions"][0]["extension_function"]["name"] = json!("ai_summarize:str_str");
        let e = from_json(v).unwrap_err().to_string();
        assert!(e.contains("ai_summarize"), "{e}");

        let mut v = imdb1_json();
        v["extension_urns"][0]["urn"] = json!("extension:someone.else:functions");
        let e = from_json(v).unwrap_err().to_string();
        assert!(e.contains("URN"), "{e}");

        let mut v = imdb1_json();
        let args = &mut v["relations"][0]["root"]["input"]["project"]["input"]["filter"]["condition"]
            ["scalar_function"]["arguments"];
        args.as_array_mut().unwrap().pop();
        let e = from_json(v).unwrap_err().to_string();
        assert!(e.contains("takes 2 arguments, got 1"), "{e}");
    }

    #[test]
    fn malformed_json_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.json");
        std::fs::write(&p, "{\"relations\": [").unwrap();
        let e = QueryPlan::from_file(&p).unwrap_err().to_string();
        assert!(e.contains("bad.json") && e.contains("malformed"), "{e}");
    }

    #[test]
    fn binary_and_json_plans_agree_and_hash_is_stable() {
        let json_plan = read_plan_file(&plans_dir().join("IMDB-8.json")).unwrap();
        let bytes = encode_plan(&json_plan);
        let back = decode_plan(&bytes, false).unwrap();
        let a = QueryPlan::from_substrait(json_plan).unwrap();
        let b = QueryPlan::from_substrait(back).unwrap();
        assert_eq!(a.operators, b.operators);
        assert_eq!(a.definition_hash("raw-v1"), b.definition_hash("raw-v1"));
        assert_ne!(
            a.definition_hash("raw-v1"),
            a.definition_hash("qwen3-chat-nonthinking-v1")
        );
    }
}
