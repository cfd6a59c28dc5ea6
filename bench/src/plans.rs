//! The QUAIL-B plans: the copy shipped inside the binary (`bench/quailb/plans/`,
//! embedded by `build.rs`; its source and licence are in `bench/quailb/NOTICE.md`),
//! or a folder that overrides it (`--plans DIR`, else `$AISQL_QUAILB_PLANS`).
//! Owns the catalog, the choice of queries of a run, and the rule that a query id
//! (`IMDB-7`) stands wherever a plan path does.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use crate::quailb::plan::QueryPlan;
use aisql_engine::inference::prompt::PromptFormat;
use aisql_engine::sql::plan_file::decode_plan;

use crate::error::{BenchError, Result};

include!(concat!(env!("OUT_DIR"), "/embedded_plans.rs"));

/// Environment variable naming a plans folder that overrides the embedded plans.
pub const PLANS_ENV: &str = "AISQL_QUAILB_PLANS";

/// The QUAIL-B version line of the embedded plans.
pub const EMBEDDED_LINE: &str = "43-query (7c76513)";

/// Where plans come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanSource {
    /// The plans built into this binary.
    Embedded,
    /// A folder with `catalog.json` and `<ID>.json` files.
    Dir(PathBuf),
}

/// One catalog entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct CatalogEntry {
    /// Query id.
    pub id: String,
    /// What the query does.
    pub description: String,
    /// PrivacyPolicies corpus (not among the 43).
    #[serde(default)]
    pub privacy: bool,
    /// Labels not published (not among the 43).
    #[serde(default)]
    pub labels_pending: bool,
}

impl CatalogEntry {
    /// True for the 43 scored queries (published labels, public corpora).
    pub fn is_scored(&self) -> bool {
        !self.privacy && !self.labels_pending
    }
}

impl PlanSource {
    /// `dir` when given (the `--plans` flag), else `$AISQL_QUAILB_PLANS` when set and
    /// not empty, else the embedded plans.
    pub fn choose(dir: Option<&Path>) -> Self {
        if let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
            return PlanSource::Dir(d.to_path_buf());
        }
        match std::env::var_os(PLANS_ENV) {
            Some(d) if !d.is_empty() => PlanSource::Dir(PathBuf::from(d)),
            _ => PlanSource::Embedded,
        }
    }

    /// How run metadata and errors name the source.
    pub fn describe(&self) -> String {
        match self {
            PlanSource::Embedded => format!("embedded QUAIL-B {EMBEDDED_LINE}"),
            PlanSource::Dir(d) => d.display().to_string(),
        }
    }

    fn error(&self, message: impl Into<String>) -> BenchError {
        BenchError::Plans {
            source_name: self.describe(),
            message: message.into(),
        }
    }

    /// The bytes of a file of the plans folder (`catalog.json`, `IMDB-7.json`).
    pub fn file(&self, name: &str) -> Result<Cow<'static, [u8]>> {
        match self {
            PlanSource::Embedded => EMBEDDED
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, bytes)| Cow::Borrowed(*bytes))
                .ok_or_else(|| self.error(format!("no file {name}"))),
            PlanSource::Dir(d) => {
                let path = d.join(name);
                aisql_engine::data::input_file::read(&path)
                    .map(Cow::Owned)
                    .map_err(|e| self.error(format!("cannot read {}: {e}", path.display())))
            }
        }
    }

    /// The catalog (`catalog.json`), in order.
    pub fn catalog(&self) -> Result<Vec<CatalogEntry>> {
        let bytes = self.file("catalog.json")?;
        let catalog: Vec<CatalogEntry> = serde_json::from_slice(&bytes)
            .map_err(|e| self.error(format!("catalog.json is not a QUAIL-B catalog: {e}")))?;
        // Ids name files here and folders of a run: they must be plain names.
        for entry in &catalog {
            plain_id(&entry.id).map_err(|e| self.error(format!("catalog.json: {e}")))?;
        }
        Ok(catalog)
    }

    /// The plan of query `id` (`<id>.json`), read and validated, its prompts
    /// in the default format.
    pub fn plan(&self, id: &str) -> Result<QueryPlan> {
        self.plan_in(id, PromptFormat::default())
    }

    /// The plan of query `id` (`<id>.json`), read, validated and planned with
    /// its prompts in `format`.
    pub fn plan_in(&self, id: &str, format: PromptFormat) -> Result<QueryPlan> {
        plain_id(id).map_err(|e| self.error(e))?;
        let name = format!("{id}.json");
        let bytes = self.file(&name)?;
        let plan = decode_plan(&bytes, true).map_err(|m| self.error(format!("{name}: {m}")))?;
        QueryPlan::from_substrait_in(plan, format).map_err(|e| self.error(format!("{name}: {e}")))
    }

    /// The queries of a run, in catalog order: `wanted` ids (`all` = the 43 scored
    /// ones; ids outside the 43, such as IMDB-16, only when named), by default the 43,
    /// planned with their prompts in `format`.
    pub fn select(
        &self,
        wanted: Option<&[String]>,
        format: PromptFormat,
    ) -> Result<Vec<(String, QueryPlan)>> {
        let catalog = self.catalog()?;
        let all = wanted.is_none_or(|w| w.iter().any(|x| x == "all"));
        if let (false, Some(w)) = (all, wanted) {
            for x in w {
                if !catalog.iter().any(|e| &e.id == x) {
                    return Err(self.error(format!(
                        "unknown query {x:?}; the catalog has {}",
                        ids_of(&catalog)
                    )));
                }
            }
        }
        catalog
            .iter()
            .filter(|e| match wanted {
                Some(w) if !all => w.contains(&e.id),
                _ => e.is_scored(),
            })
            .map(|e| Ok((e.id.clone(), self.plan_in(&e.id, format)?)))
            .collect()
    }
}

fn ids_of(catalog: &[CatalogEntry]) -> String {
    catalog
        .iter()
        .map(|e| e.id.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A plan named on the command line: a file when `arg` names one, else the query
/// id `arg` of `source`'s catalog (`aisql explain IMDB-7`), planned with its
/// prompts in `format`.
pub fn open_plan(arg: &str, source: &PlanSource, format: PromptFormat) -> Result<QueryPlan> {
    let path = Path::new(arg);
    if path.is_file() {
        return QueryPlan::from_file_in(path, format);
    }
    let catalog = source.catalog()?;
    if catalog.iter().any(|e| e.id == arg) {
        return source.plan_in(arg, format);
    }
    let message = if let Err(e) = aisql_engine::data::input_file::regular_file(path)
        && path.exists()
    {
        format!("is {e}")
    } else {
        format!(
            "no such file, and not a query id of the QUAIL-B catalog ({}: {})",
            source.describe(),
            ids_of(&catalog)
        )
    };
    Err(BenchError::PlanArg {
        arg: arg.to_string(),
        message,
    })
}

/// A query id names `<id>.json` in the plans folder and `<id>/` in a run folder,
/// so it must be a plain name.
fn plain_id(id: &str) -> std::result::Result<(), String> {
    crate::layout::plain_name("query id", id).map_err(|_| {
        format!(
            "query id {id:?} is not a plain name (it would name a path outside the plans or run folder)"
        )
    })
}

/// The repository's copy of the plans (`bench/quailb/plans`), which is what is
/// embedded; for tests and benches that read plan files directly.
pub fn repository_plans_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("quailb")
        .join("plans")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_plans_are_the_repository_folder() {
        let dir = repository_plans_dir();
        let mut on_disk = Vec::new();
        fn walk(d: &Path, base: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, base, out);
                } else {
                    let rel = p.strip_prefix(base).unwrap();
                    out.push(rel.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        walk(&dir, &dir, &mut on_disk);
        on_disk.sort();
        let mut embedded: Vec<String> = EMBEDDED.iter().map(|(n, _)| n.to_string()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk);
        for (name, bytes) in EMBEDDED {
            assert_eq!(
                *bytes,
                std::fs::read(dir.join(name)).unwrap().as_slice(),
                "{name}"
            );
        }
        assert!(embedded.contains(&"substrait_extensions.yaml".to_string()));
    }

    #[test]
    fn catalog_has_43_scored_queries_and_every_plan_reads() {
        let source = PlanSource::Embedded;
        let catalog = source.catalog().unwrap();
        assert_eq!(catalog.len(), 46);
        assert_eq!(catalog.iter().filter(|e| e.is_scored()).count(), 43);
        let all = source.select(None, Default::default()).unwrap();
        assert_eq!(all.len(), 43);
        assert_eq!(all[0].0, "IMDB-1");
        assert!(source.plan("IMDB-16").is_ok() && source.plan("PRIV-2").is_ok());
        let named = source
            .select(
                Some(&["FEV-1".to_string(), "IMDB-16".to_string()]),
                Default::default(),
            )
            .unwrap();
        let ids: Vec<&str> = named.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["IMDB-16", "FEV-1"], "catalog order");
        let e = source
            .select(Some(&["IMDB-99".to_string()]), Default::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("IMDB-99") && e.contains("IMDB-1,"), "{e}");
    }

    #[test]
    fn a_folder_overrides_and_a_plan_arg_is_a_path_or_an_id() {
        let d = tempfile::tempdir().unwrap();
        let src = repository_plans_dir();
        for name in ["catalog.json", "IMDB-1.json"] {
            std::fs::copy(src.join(name), d.path().join(name)).unwrap();
        }
        let folder = PlanSource::Dir(d.path().to_path_buf());
        assert_eq!(PlanSource::choose(Some(d.path())), folder);
        assert!(folder.plan("IMDB-1").is_ok());
        let e = folder.plan("IMDB-2").unwrap_err().to_string();
        assert!(
            e.contains("IMDB-2.json") && e.contains(&d.path().display().to_string()),
            "{e}"
        );
        // A path wins over an id; an id is looked up in the source's catalog.
        let by_path = open_plan(
            src.join("FEV-8.json").to_str().unwrap(),
            &folder,
            Default::default(),
        )
        .unwrap();
        let by_id = open_plan("FEV-8", &PlanSource::Embedded, Default::default()).unwrap();
        assert_eq!(
            by_path.definition_hash("raw-v1"),
            by_id.definition_hash("raw-v1")
        );
        let e = open_plan("NOPE-1", &PlanSource::Embedded, Default::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("NOPE-1") && e.contains("no such file") && e.contains("FEV-8"),
            "{e}"
        );
        let e = open_plan(d.path().to_str().unwrap(), &folder, Default::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a folder, not a regular file"), "{e}");
        // A broken catalog is named.
        std::fs::write(d.path().join("catalog.json"), "{").unwrap();
        let e = folder.catalog().unwrap_err().to_string();
        assert!(e.contains("catalog.json"), "{e}");
    }

    #[test]
    fn a_catalog_id_that_would_leave_its_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("catalog.json"),
            r#"[{"id": "../../escape", "description": "x"}]"#,
        )
        .unwrap();
        let source = PlanSource::choose(Some(dir.path()));
        let e = source.catalog().unwrap_err().to_string();
        assert!(
            e.contains("../../escape") && e.contains("not a plain name"),
            "{e}"
        );
        let e = PlanSource::Embedded
            .plan("../IMDB-1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a plain name"), "{e}");
    }
}
