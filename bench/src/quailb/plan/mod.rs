//! QUAIL-B plan files: loading (ProtoJSON or binary protobuf), the version and
//! extension checks, and [`QueryPlan`], the benchmark's view of a query
//! (relations, AI operators and IN-lists in post-order, selected columns;
//! SPEC §A).
//!
//! The Substrait plan is planned once: DataFusion's consumer
//! ([`crate::quailb::consumer::QuailbConsumer`]) reads it over empty tables of
//! the columns the reads declare, and the AI rewrite makes its AI calls AI
//! nodes. The view is derived from that analyzed plan ([`derive`]), so it needs
//! no data, and a run executes the same plan with its scans given the data
//! ([`crate::quailb::query`]). Operator ids, prompts and documents are the AI
//! nodes' own. Extension functions are resolved by name and URN, never by
//! anchor.

mod derive;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use aisql_engine::inference::backend::AiKind;
use aisql_engine::inference::kinds::call_pieces;
use aisql_engine::inference::prompt::{PromptFormat, PromptPieces};
use datafusion::logical_expr::LogicalPlan;
use datafusion_substrait::substrait::proto::{Plan, extensions, plan_rel, rel};
use serde_json::json;

use aisql_engine::EngineError;

use crate::error::{BenchError, Result};

/// The Substrait version QUAIL-B plans are written with.
pub const SUBSTRAIT_VERSION: (u32, u32, u32) = (0, 103, 0);
/// URN of the AI functions.
pub use aisql_engine::exec::ai_functions::AI_URN;
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

    /// The pieces of this operator's prompts in `format` (None for IN-lists):
    /// the prompts an AI operator of the same kind renders.
    pub fn prompt_pieces(
        &self,
        format: PromptFormat,
    ) -> aisql_engine::Result<Option<PromptPieces>> {
        let (kind, pair, template, labels, descriptions): (_, _, _, &[String], &[String]) =
            match self {
                Operator::Filter { template, .. } => (AiKind::Filter, false, template, &[], &[]),
                Operator::Join { template, .. } => (AiKind::Join, true, template, &[], &[]),
                Operator::Classify {
                    template,
                    labels,
                    descriptions,
                    partner,
                    ..
                } => (
                    AiKind::Classify,
                    partner.is_some(),
                    template,
                    labels,
                    descriptions,
                ),
                Operator::InList { .. } => return Ok(None),
            };
        call_pieces(format, kind, template, pair, labels, descriptions).map(Some)
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
    /// Operators over scans, the root operator on top (what `explain` draws).
    pub tree: PlanTree,
    /// DataFusion's analyzed plan (AI calls as AI nodes, prompts in
    /// [`Self::format`]) over the empty tables the reads declare: the view's
    /// source, and the plan a run in that format executes.
    pub analyzed: LogicalPlan,
    /// The prompt format [`Self::analyzed`] renders.
    pub format: PromptFormat,
    /// How long planning [`Self::analyzed`] took: part of a run's time, as
    /// consuming the plan was when a run planned it.
    pub planning: Duration,
}

/// The operators and scans of a plan as a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanTree {
    /// A scan: its index in [`QueryPlan::relations`].
    Scan(usize),
    /// An operator (its index in [`QueryPlan::operators`]) over its inputs.
    Operator(usize, Vec<PlanTree>),
}

/// DataFusion's analyzed plan of `plan` over the tables its reads declare, its
/// prompts in `format`, and the view derived from it, whose root names its
/// columns `root_names`.
fn derive_view(
    plan: &Plan,
    root_names: &[String],
    format: PromptFormat,
) -> Result<(LogicalPlan, derive::Derived)> {
    use aisql_engine::sql::{Evaluation, SqlSession};
    // Planning asks no model: any backend will do.
    let backend =
        std::sync::Arc::new(crate::quailb::oracle::OracleBackend::new(Default::default()));
    let options = aisql_engine::sql::options::QueryOptions {
        format,
        ..Default::default()
    };
    let session = SqlSession::new(backend, options, Evaluation::Operators)?;
    let (analyzed, hints) =
        futures::executor::block_on(crate::quailb::consumer::analyze(&session, plan))?;
    // The root's own projection is the last relation consumed.
    let below_root = hints.split_last().map_or(&[][..], |(_, rest)| rest);
    let derived = derive::derive(&analyzed, below_root, root_names)?;
    Ok((analyzed, derived))
}

/// The names the plan's root gives its columns (none where it has no root).
fn root_names(plan: &Plan) -> &[String] {
    match plan.relations.first().and_then(|r| r.rel_type.as_ref()) {
        Some(plan_rel::RelType::Root(root)) => &root.names,
        _ => &[],
    }
}

/// A plan of QUAIL-B's own shape that breaks one of its rules (SPEC §A).
fn invalid(msg: impl Into<String>) -> BenchError {
    BenchError::Engine(EngineError::InvalidPlan(msg.into()))
}

/// A plan of another shape than QUAIL-B's: valid, perhaps, as a general query.
fn not_quailb(msg: impl Into<String>) -> BenchError {
    BenchError::NotQuailb(msg.into())
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
            return Err(not_quailb(format!(
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

impl QueryPlan {
    /// Reads and validates a plan file, its prompts in the default format.
    pub fn from_file(path: &Path) -> Result<Self> {
        Self::from_file_in(path, PromptFormat::default())
    }

    /// Reads and validates a plan file, planned with its prompts in `format`.
    pub fn from_file_in(path: &Path, format: PromptFormat) -> Result<Self> {
        let plan = aisql_engine::sql::plan_file::read_plan_file(path)?;
        let path = path.display().to_string();
        Self::from_substrait_in(plan, format).map_err(|e| match e {
            BenchError::Engine(EngineError::InvalidPlan(message)) => {
                BenchError::Engine(EngineError::PlanFile { path, message })
            }
            BenchError::NotQuailb(m) => BenchError::NotQuailb(format!("{path}: {m}")),
            other => other,
        })
    }

    /// Validates a decoded plan and derives the query description, its
    /// prompts in the default format.
    pub fn from_substrait(plan: Plan) -> Result<Self> {
        Self::from_substrait_in(plan, PromptFormat::default())
    }

    /// Validates a decoded plan and derives the query description, planned
    /// with its prompts in `format` (the format the query will run in).
    pub fn from_substrait_in(plan: Plan, format: PromptFormat) -> Result<Self> {
        let version = plan
            .version
            .as_ref()
            .ok_or_else(|| not_quailb("no Substrait version (expected 0.103.0)"))?;
        let got = (
            version.major_number,
            version.minor_number,
            version.patch_number,
        );
        if got != SUBSTRAIT_VERSION {
            return Err(not_quailb(format!(
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
            return Err(not_quailb(format!(
                "expected exactly one relation (a root), found {}",
                plan.relations.len()
            )));
        }
        let Some(plan_rel::RelType::Root(root)) = &plan.relations[0].rel_type else {
            return Err(not_quailb("the plan's relation is not a root"));
        };
        let root_input = root
            .input
            .as_ref()
            .ok_or_else(|| invalid("the root has no input"))?;
        if !matches!(&root_input.rel_type, Some(rel::RelType::Project(_))) {
            return Err(not_quailb("the root's input is not a projection"));
        }

        let started = Instant::now();
        let (analyzed, derived) = derive_view(&plan, &root.names, format)?;
        let planning = started.elapsed();
        let query = QueryPlan {
            substrait: plan,
            functions: declared,
            relations: derived.relations,
            operators: derived.operators,
            select: derived.select,
            tree: derived.tree,
            analyzed,
            format,
            planning,
        };
        query.validate()?;
        Ok(query)
    }

    /// The analyzed plan with its prompts in `format`: [`Self::analyzed`], or
    /// where that renders another format, the plan analyzed anew in `format`,
    /// whose view must be this one (a format changes prompts, not operators).
    pub fn analyzed_in(&self, format: PromptFormat) -> Result<Cow<'_, LogicalPlan>> {
        if format == self.format {
            return Ok(Cow::Borrowed(&self.analyzed));
        }
        let (analyzed, view) = derive_view(&self.substrait, root_names(&self.substrait), format)?;
        if view.relations != self.relations
            || view.operators != self.operators
            || view.select != self.select
            || view.tree != self.tree
        {
            return Err(invalid(format!(
                "the plan's operators in prompt format {} differ from those in {}",
                format.name(),
                self.format.name()
            )));
        }
        Ok(Cow::Owned(analyzed))
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
                    return Err(not_quailb(format!(
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
                    return Err(not_quailb(format!(
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
        aisql_standin::canonical::sha256_hex(&def)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aisql_engine::sql::plan_file::{decode_plan, encode_plan, read_plan_file};
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
        assert!(e.contains("ai_filter takes 2 arguments, got 1"), "{e}");
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
