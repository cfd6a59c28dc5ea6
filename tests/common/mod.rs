//! Test support: a tiny labelled QUAIL-B corpus built in the test, and an
//! independent evaluator of the reference result (SPEC §D.2) over its labels.
//!
//! The corpus has every table of SPEC §C with its columns and id formats, a few
//! rows each, written as Parquet with nullable fields (as pyarrow writes them).
//! Labels are drawn from a fixed hash so every run is identical; every document
//! and pair of every predicate the plans use gets one.
//!
//! The helpers of the command-line tests are in [`cli`] (running `aisql`) and
//! [`server`] (workers and servers they talk to). Each test file is its own crate
//! and uses only some of this, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod cli;
pub mod server;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aisql_bench::quailb::labels::{LabelSet, LabelStore, LabelValue, PredicateInfo};
use aisql_bench::quailb::plan::{Operator, QueryPlan};
use aisql_engine::inference::backend::AiKind;
use datafusion::arrow::array::{
    ArrayRef, Int32Array, ListBuilder, RecordBatch, StringArray, StringBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;

/// A Python that can import `module`: `AISQL_TEST_PYTHON`, or the environment
/// `scripts/test-tools.sh` makes (`AISQL_TEST_VENV`, by default
/// `~/.cache/aisql-test-venv`). Fails with the install line when it cannot;
/// `package` names what provides the module.
pub fn test_python(module: &str, package: &str) -> PathBuf {
    let venv = std::env::var_os("AISQL_TEST_VENV")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/aisql-test-venv")));
    let python = std::env::var_os("AISQL_TEST_PYTHON")
        .map(PathBuf::from)
        .or_else(|| venv.map(|v| v.join("bin/python")))
        .unwrap_or_else(|| PathBuf::from("python3"));
    let has_it = std::process::Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        has_it,
        "{} cannot import {module}: run scripts/test-tools.sh (a Python environment \
         with {package} in ~/.cache/aisql-test-venv), or set AISQL_TEST_PYTHON to a \
         Python that has it",
        python.display()
    );
    python
}

/// (answers reused, questions asked) from the stderr of an `--answer-cache` run.
pub fn cache_counts(stderr: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("answer cache: "))
        .unwrap_or_else(|| panic!("no answer-cache summary in:\n{stderr}"));
    let numbers: Vec<u64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
    assert_eq!(numbers.len(), 2, "{line}");
    (numbers[0], numbers[1])
}

/// The bytes of the answer log under `answers` (one identity folder), 0 before
/// it exists.
pub fn log_bytes(answers: &Path) -> u64 {
    std::fs::read_dir(answers)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::metadata(e.path().join("answers.v4")).ok())
        .map(|m| m.len())
        .sum()
}

/// A CLI run that must fail with an error (exit code 1: not a usage error, not a
/// panic or a signal), giving its stderr.
pub trait Fails {
    /// Runs, asserts exit code 1 and returns stderr.
    fn fails(&mut self) -> String;
}

impl Fails for assert_cmd::Command {
    fn fails(&mut self) -> String {
        let out = self.assert().code(1).get_output().stderr.clone();
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// The repository's QUAIL-B plans (the ones built into the binary).
pub fn plans_dir() -> PathBuf {
    aisql_bench::plans::repository_plans_dir()
}

/// The repository's plans of the queries `ids`.
pub fn load_plans<S: AsRef<str>>(ids: &[S]) -> Vec<QueryPlan> {
    ids.iter()
        .map(|id| QueryPlan::from_file(&plans_dir().join(format!("{}.json", id.as_ref()))).unwrap())
        .collect()
}

/// The 43 scored query ids, in catalog order.
pub fn catalog_ids() -> Vec<String> {
    let text = std::fs::read_to_string(plans_dir().join("catalog.json")).unwrap();
    let catalog: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    catalog
        .iter()
        .filter(|q| {
            !q["privacy"].as_bool().unwrap_or(false)
                && !q["labels_pending"].as_bool().unwrap_or(false)
        })
        .map(|q| q["id"].as_str().unwrap().to_string())
        .collect()
}

/// A stable 64-bit hash (FNV-1a) for drawing labels.
pub fn draw(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.bytes().chain([0u8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h ^ (h >> 29)
}

/// One table: ids and texts plus its extra columns.
pub struct TinyTable {
    pub ids: Vec<String>,
    pub texts: Vec<String>,
    pub text_column: &'static str,
}

/// The tiny corpus: table name -> rows.
pub struct TinyCorpus {
    pub dir: PathBuf,
    pub tables: BTreeMap<String, TinyTable>,
}

fn string_col(v: &[String]) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(v))
}

fn list_col(v: &[Vec<String>]) -> ArrayRef {
    let mut b = ListBuilder::new(StringBuilder::new());
    for row in v {
        for s in row {
            b.values().append_value(s);
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

const ASPECTS: [&str; 12] = [
    "the acting",
    "the plot",
    "the directing",
    "the cinematography",
    "the soundtrack",
    "the pacing",
    "the ending",
    "the dialogue",
    "the special effects",
    "the character development",
    "the screenplay",
    "the editing",
];

impl TinyCorpus {
    /// Writes the corpus as `<table>.parquet` files under `dir`.
    pub fn write(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let ids = |prefix: &str, n: usize| -> Vec<String> {
            (0..n).map(|i| format!("{prefix}{i}")).collect()
        };
        let texts = |kind: &str, ids: &[String]| -> Vec<String> {
            ids.iter()
                .map(|i| format!("The {kind} {i} says something worth judging."))
                .collect()
        };
        let mut tables = BTreeMap::new();
        let mut add = |name: &str,
                       text_column: &'static str,
                       ids: Vec<String>,
                       texts: Vec<String>,
                       extra: Vec<(&str, ArrayRef)>| {
            let mut cols = vec![("id", string_col(&ids)), (text_column, string_col(&texts))];
            cols.extend(extra);
            write_parquet(&dir.join(format!("{name}.parquet")), cols);
            tables.insert(
                name.to_string(),
                TinyTable {
                    ids,
                    texts,
                    text_column,
                },
            );
        };
        let rv = ids("rv", 12);
        add("reviews", "body", rv.clone(), texts("review", &rv), vec![]);
        let asp = ids("as", 12);
        add(
            "aspects",
            "aspect",
            asp,
            ASPECTS.iter().map(|s| s.to_string()).collect(),
            vec![],
        );
        let tm = ids("tm", 8);
        let rp = ids("rp", 7);
        let reactions: Vec<Vec<String>> = (0..rp.len())
            .map(|i| vec![format!("term {}", i % 8)])
            .collect();
        add(
            "reports",
            "report",
            rp.clone(),
            texts("report", &rp),
            vec![("reactions", list_col(&reactions))],
        );
        add(
            "terms",
            "term",
            tm.clone(),
            (0..tm.len()).map(|i| format!("term {i}")).collect(),
            vec![],
        );
        let ev: Vec<String> = (0..6).map(|i| format!("Wiki_Page_{i}")).collect();
        let cl = ids("cl", 9);
        let verdicts: Vec<String> = (0..cl.len())
            .map(|i| if i % 3 == 0 { "REFUTES" } else { "SUPPORTS" }.to_string())
            .collect();
        let urls: Vec<String> = (0..cl.len()).map(|i| ev[i % ev.len()].clone()).collect();
        add(
            "claims",
            "claim",
            cl.clone(),
            texts("claim", &cl),
            vec![
                ("label", string_col(&verdicts)),
                ("evidence_wiki_url", string_col(&urls)),
            ],
        );
        add("evidence", "text", ev.clone(), texts("page", &ev), vec![]);
        let lc = ids("lc", 8);
        let lp = ids("lp", 6);
        let cited: Vec<Vec<String>> = (0..lc.len()).map(|i| vec![format!("p{}", i % 6)]).collect();
        let pids: Vec<Vec<String>> = (0..lp.len()).map(|i| vec![format!("p{i}")]).collect();
        add(
            "citation_contexts",
            "destination_context",
            lc.clone(),
            texts("excerpt", &lc),
            vec![("cited_passage_ids", list_col(&cited))],
        );
        add(
            "citation_passages",
            "passage_text",
            lp.clone(),
            texts("passage", &lp),
            vec![("passage_ids", list_col(&pids))],
        );
        let at: Vec<String> = (0..10)
            .map(|i| format!("at{:04}-t{:03}", i / 3, 5 * (i % 3 + 1)))
            .collect();
        let traj: Vec<String> = at.iter().map(|s| s[..6].to_string()).collect();
        let turns: Vec<i32> = (0..10).map(|i| 5 * (i % 3 + 1)).collect();
        add(
            "agent_traces",
            "trace",
            at.clone(),
            texts("trace", &at),
            vec![
                ("trajectory_id", string_col(&traj)),
                (
                    "turn_index",
                    Arc::new(Int32Array::from(turns.clone())) as ArrayRef,
                ),
                (
                    "token_count",
                    Arc::new(Int32Array::from(
                        turns.iter().map(|t| t * 100).collect::<Vec<_>>(),
                    )) as ArrayRef,
                ),
            ],
        );
        Self {
            dir: dir.to_path_buf(),
            tables,
        }
    }

    /// Replaces `agent_traces` with `trajectories` trajectories of `snapshots`
    /// snapshots each, as SWE-Next has them: a snapshot is its trajectory's
    /// text up to a turn, so each one extends the one before and every
    /// trajectory opens with the same system prompt.
    pub fn with_agent_snapshots(mut self, trajectories: usize, snapshots: usize) -> Self {
        let (mut ids, mut texts, mut traj, mut turns, mut counts) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for j in 0..trajectories {
            let mut text = String::from("You are a coding agent. Fix the reported issue.\n");
            for k in 1..=snapshots {
                for step in 0..4 {
                    text.push_str(&format!(
                        "<turn {k}.{step}> agent {j} reads file_{j}_{k}_{step}.py and runs test {k}.\n"
                    ));
                }
                let turn = 5 * k as i32;
                ids.push(format!("at{j:04}-t{turn:03}"));
                texts.push(text.clone());
                traj.push(format!("at{j:04}"));
                turns.push(turn);
                counts.push(text.split_whitespace().count() as i32);
            }
        }
        write_parquet(
            &self.dir.join("agent_traces.parquet"),
            vec![
                ("id", string_col(&ids)),
                ("trace", string_col(&texts)),
                ("trajectory_id", string_col(&traj)),
                ("turn_index", Arc::new(Int32Array::from(turns)) as ArrayRef),
                (
                    "token_count",
                    Arc::new(Int32Array::from(counts)) as ArrayRef,
                ),
            ],
        );
        self.tables.insert(
            "agent_traces".into(),
            TinyTable {
                ids,
                texts,
                text_column: "trace",
            },
        );
        self
    }

    /// `<table>.parquet` paths.
    pub fn paths(&self) -> BTreeMap<String, PathBuf> {
        self.tables
            .keys()
            .map(|t| (t.clone(), self.dir.join(format!("{t}.parquet"))))
            .collect()
    }
}

/// Reference labels of one predicate, keyed by (left id, right id or "").
#[derive(Default, Clone)]
pub struct TinyLabels {
    pub bools: HashMap<(String, String), bool>,
    pub labels: HashMap<(String, String), String>,
}

/// Labels for every predicate the given plans use, by template.
pub fn draw_labels(
    corpus: &TinyCorpus,
    plans: &[QueryPlan],
) -> (LabelStore, HashMap<String, TinyLabels>) {
    let mut infos: BTreeMap<String, PredicateInfo> = BTreeMap::new();
    for q in plans {
        for op in &q.operators {
            let rel = |a: &str| q.relation(a).unwrap();
            let (kind, left, right, labels, descriptions) = match op {
                Operator::Filter { alias, .. } => {
                    (AiKind::Filter, rel(alias), None, vec![], vec![])
                }
                Operator::Join { aliases, .. } => (
                    AiKind::Join,
                    rel(&aliases[0]),
                    Some(rel(&aliases[1])),
                    vec![],
                    vec![],
                ),
                Operator::Classify {
                    alias,
                    partner,
                    labels,
                    descriptions,
                    ..
                } => (
                    AiKind::Classify,
                    rel(alias),
                    partner.as_deref().map(rel),
                    labels.clone(),
                    descriptions.clone(),
                ),
                Operator::InList { .. } => continue,
            };
            let template = op.template().unwrap().to_string();
            infos.entry(template.clone()).or_insert(PredicateInfo {
                key: format!("tiny.{}", draw(&[&template]) % 1_000_000),
                kind,
                template,
                left_table: left.table.clone(),
                left_column: left.text_column.clone(),
                right_table: right.map(|r| r.table.clone()),
                right_column: right.map(|r| r.text_column.clone()),
                labels,
                descriptions,
            });
        }
    }
    let mut store = LabelStore::new("gt_tiny", "tiny-reference");
    let mut plain = HashMap::new();
    // Joined-row classifications only label the pairs of the join they follow:
    // here, DISCUSS_ASPECT's TRUE pairs.
    let discuss = "Does the review in DOCUMENT {0} discuss the movie aspect in DOCUMENT {1}?";
    for (template, info) in &infos {
        let mut set = LabelSet::new(info.clone(), format!("ls_{}", info.key));
        let mut t = TinyLabels::default();
        let left = &corpus.tables[&info.left_table].ids;
        let rights: Vec<Option<&String>> = match &info.right_table {
            Some(r) => corpus.tables[r].ids.iter().map(Some).collect(),
            None => vec![None],
        };
        for l in left {
            for r in &rights {
                let r_id = r.map(|s| s.as_str()).unwrap_or("");
                let h = draw(&[template, l, r_id]);
                match info.kind {
                    AiKind::Filter | AiKind::Join => {
                        let pct = if info.kind == AiKind::Filter { 60 } else { 40 };
                        let b = h % 100 < pct;
                        set.insert(l, r.map(|s| s.as_str()), LabelValue::Bool(b))
                            .unwrap();
                        t.bools.insert((l.clone(), r_id.to_string()), b);
                    }
                    AiKind::Classify => {
                        if r.is_some() && !draw_bool(discuss, l, r_id) {
                            continue;
                        }
                        let label = info.labels[(h % info.labels.len() as u64) as usize].clone();
                        set.insert(l, r.map(|s| s.as_str()), LabelValue::Label(label.clone()))
                            .unwrap();
                        t.labels.insert((l.clone(), r_id.to_string()), label);
                    }
                    other => unreachable!("a QUAIL-B predicate of kind {other:?}"),
                }
            }
        }
        store.insert(set).unwrap();
        plain.insert(template.clone(), t);
    }
    (store, plain)
}

fn draw_bool(template: &str, l: &str, r: &str) -> bool {
    draw(&[template, l, r]) % 100 < 40
}

/// The reference result of SPEC §D.2, computed from the labels alone: sorted
/// distinct rows of the selected columns.
pub fn reference_rows(
    q: &QueryPlan,
    corpus: &TinyCorpus,
    labels: &HashMap<String, TinyLabels>,
) -> Vec<Vec<String>> {
    // Per alias survivors.
    let mut survivors: HashMap<String, BTreeSet<String>> = HashMap::new();
    for r in &q.relations {
        survivors.insert(
            r.alias.clone(),
            corpus.tables[&r.table].ids.iter().cloned().collect(),
        );
    }
    let one_doc_label = |template: &str, id: &str| {
        labels[template]
            .labels
            .get(&(id.to_string(), String::new()))
            .cloned()
    };
    for op in &q.operators {
        match op {
            Operator::Filter {
                alias, template, ..
            } => {
                let l = &labels[template];
                survivors
                    .get_mut(alias)
                    .unwrap()
                    .retain(|id| l.bools[&(id.clone(), String::new())]);
            }
            Operator::Classify {
                alias,
                template,
                partner: None,
                ..
            } => {
                survivors
                    .get_mut(alias)
                    .unwrap()
                    .retain(|id| one_doc_label(template, id).is_some());
            }
            Operator::InList {
                alias,
                output,
                accepted,
                ..
            } => {
                let Some(Operator::Classify { template, .. }) = q.operators.iter().find(
                    |o| matches!(o, Operator::Classify { alias: a, output: c, .. } if a == alias && c == output),
                ) else {
                    panic!("in-list without classification")
                };
                survivors.get_mut(alias).unwrap().retain(|id| {
                    one_doc_label(template, id).is_some_and(|l| accepted.contains(&l))
                });
            }
            _ => {}
        }
    }
    // Rows as alias -> id maps, natural-joined over the joins.
    let table_of = |alias: &str| &q.relation(alias).unwrap().table;
    let column_of = |alias: &str, id: &str, column: &str| -> String {
        // Equality columns in the 43: claims.evidence_wiki_url and evidence.id.
        if column == "id" {
            return id.to_string();
        }
        let t = table_of(alias);
        assert_eq!((t.as_str(), column), ("claims", "evidence_wiki_url"));
        let i: usize = id[2..].parse().unwrap();
        format!("Wiki_Page_{}", i % 6)
    };
    let mut rows: Option<Vec<BTreeMap<String, String>>> = None;
    for op in &q.operators {
        let Operator::Join {
            aliases,
            template,
            on,
            ..
        } = op
        else {
            continue;
        };
        let l = &labels[template];
        let mut pairs = Vec::new();
        for a in &survivors[&aliases[0]] {
            for b in &survivors[&aliases[1]] {
                let eq = on
                    .iter()
                    .all(|(c0, c1)| column_of(&aliases[0], a, c0) == column_of(&aliases[1], b, c1));
                if eq && l.bools[&(a.clone(), b.clone())] {
                    pairs.push(BTreeMap::from([
                        (aliases[0].clone(), a.clone()),
                        (aliases[1].clone(), b.clone()),
                    ]));
                }
            }
        }
        rows = Some(match rows {
            None => pairs,
            Some(prev) => {
                let mut out = Vec::new();
                for p in &prev {
                    for n in &pairs {
                        if n.iter().all(|(k, v)| p.get(k).is_none_or(|x| x == v)) {
                            let mut m = p.clone();
                            m.extend(n.clone());
                            out.push(m);
                        }
                    }
                }
                out
            }
        });
    }
    let rows = rows.unwrap_or_else(|| {
        let base = &q.relations[0].alias;
        survivors[base]
            .iter()
            .map(|id| BTreeMap::from([(base.clone(), id.clone())]))
            .collect()
    });
    let mut out = BTreeSet::new();
    'row: for r in rows {
        let mut v = Vec::new();
        for s in &q.select {
            if s.column == "id" {
                v.push(r[&s.alias].clone());
                continue;
            }
            let Some(Operator::Classify { template, partner, .. }) = q.operators.iter().find(
                |o| matches!(o, Operator::Classify { alias, output, .. } if *alias == s.alias && *output == s.column),
            ) else {
                panic!("selected label without classification")
            };
            let key = (
                r[&s.alias].clone(),
                partner.as_ref().map(|p| r[p].clone()).unwrap_or_default(),
            );
            match labels[template].labels.get(&key) {
                Some(l) => v.push(l.clone()),
                None if partner.is_some() => panic!("joined row without a reference label"),
                None => continue 'row,
            }
        }
        out.insert(v);
    }
    out.into_iter().collect()
}

/// Sorted distinct rows of an engine result.
pub fn result_rows(batch: &RecordBatch) -> Vec<Vec<String>> {
    use datafusion::arrow::array::AsArray;
    let mut out = BTreeSet::new();
    for i in 0..batch.num_rows() {
        out.insert(
            batch
                .columns()
                .iter()
                .map(|c| {
                    assert_eq!(c.data_type(), &DataType::Utf8);
                    c.as_string::<i32>().value(i).to_string()
                })
                .collect::<Vec<_>>(),
        );
    }
    out.into_iter().collect()
}

/// A query's rows kept in memory with the rest of its output (what
/// [`aisql_bench::quailb::query::run_query`] returns), read through as the output.
#[derive(Debug)]
pub struct Collected {
    /// The result rows in one batch.
    pub rows: RecordBatch,
    /// Answers, measurements and the like.
    pub out: aisql_bench::quailb::query::QueryOutput,
}

impl std::ops::Deref for Collected {
    type Target = aisql_bench::quailb::query::QueryOutput;
    fn deref(&self) -> &Self::Target {
        &self.out
    }
}

/// [`aisql_bench::quailb::query::run_query`], its rows and output together.
pub async fn collect_query(
    query: &QueryPlan,
    paths: &aisql_engine::data::tables::TablePaths,
    backend: Arc<dyn aisql_engine::inference::backend::InferenceBackend>,
    options: &aisql_engine::sql::options::QueryOptions,
) -> aisql_bench::error::Result<Collected> {
    let (rows, out) = aisql_bench::quailb::query::run_query(query, paths, backend, options).await?;
    Ok(Collected { rows, out })
}
