//! Read-only SQL: which statements that write files or change the session a
//! [`SqlSession`](super::SqlSession) runs ([`WritePolicy`]), and the check of a
//! plan against it, before anything runs. Writes obey the one write rule
//! ([`crate::data::write_guard`]).

use datafusion::logical_expr::LogicalPlan;

use crate::error::{EngineError, Result};

/// Which statements that write or change state a session runs. By default
/// none: SQL is read-only.
#[derive(Debug, Clone, Default)]
pub struct WritePolicy {
    /// `--allow-writes`: `COPY ... TO` (outside the inputs), `CREATE VIEW`,
    /// `CREATE TABLE ... AS`, `DROP`, `SET` and writes into in-memory tables
    /// (every registered table is read whole into memory) run. `CREATE
    /// EXTERNAL TABLE` never does: it reads paths nobody named on the command
    /// line; nor a write into a table that reads files, which would write into
    /// an input.
    pub allow_writes: bool,
    /// The command's inputs, which no `COPY` may write over or into.
    pub guard: crate::data::write_guard::WriteGuard,
    /// How the user lets statements write (`aisql sql`'s `--allow-writes`),
    /// said when one is refused; `None` where nothing can (a plan file, a
    /// server).
    pub how_to_allow: Option<String>,
}

/// Refuses a plan that writes or changes state where `policy` does not allow
/// it, naming the statement; looks inside `EXPLAIN ANALYZE` and subqueries.
pub(super) fn check_writes(plan: &LogicalPlan, policy: &WritePolicy) -> Result<()> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::logical_expr::DdlStatement;
    let read_only = |what: String| {
        EngineError::WriteRefused(match &policy.how_to_allow {
            Some(how) => format!("{what}: aisql's SQL is read-only; {how}"),
            None => format!(
                "{what}: aisql's SQL is read-only here: no statement may write or change the session"
            ),
        })
    };
    let mut refused = None;
    plan.apply_with_subqueries(|p| {
        let outcome = match p {
            LogicalPlan::Copy(copy) if !policy.allow_writes => Err(read_only(format!(
                "COPY ... TO '{}' writes files",
                copy.output_url
            ))),
            LogicalPlan::Copy(copy) => copy_target(&copy.output_url).and_then(|(path, kind)| {
                policy
                    .guard
                    .check(&path, &format!("COPY ... TO '{}'", copy.output_url), kind)
            }),
            LogicalPlan::Dml(dml) => {
                let what = format!("{} {}", dml.op.name().to_uppercase(), dml.table_name);
                let in_memory = datafusion::datasource::source_as_provider(&dml.target)
                    .is_ok_and(|t| t.is::<datafusion::datasource::MemTable>());
                if !policy.allow_writes {
                    Err(read_only(what))
                } else if !in_memory {
                    Err(EngineError::WriteRefused(format!(
                        "{what}: {} is read from files, and aisql never writes into its inputs",
                        dml.table_name
                    )))
                } else {
                    Ok(())
                }
            }
            LogicalPlan::Ddl(DdlStatement::CreateExternalTable(t)) => {
                Err(EngineError::WriteRefused(format!(
                    "CREATE EXTERNAL TABLE {} LOCATION '{}': SQL may not open files; register them with --table NAME=PATH",
                    t.name,
                    t.locations.join("', '")
                )))
            }
            LogicalPlan::Ddl(ddl) if !policy.allow_writes => {
                Err(read_only(statement_name(ddl.name())))
            }
            LogicalPlan::Statement(statement) if !policy.allow_writes => {
                Err(read_only(statement_name(statement.name())))
            }
            _ => Ok(()),
        };
        Ok(match outcome {
            Ok(()) => TreeNodeRecursion::Continue,
            Err(e) => {
                refused = Some(e);
                TreeNodeRecursion::Stop
            }
        })
    })?;
    refused.map_or(Ok(()), Err)
}

/// A plan node's name (`CreateView`, `SetVariable`) as SQL words (`CREATE VIEW`,
/// `SET VARIABLE`).
fn statement_name(name: &str) -> String {
    let mut words = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            words.push(' ');
        }
        words.push(c.to_ascii_uppercase());
    }
    words
}

/// The local path of a `COPY ... TO` target and how it is written: a folder
/// when it ends with a slash or has no extension (DataFusion writes files
/// into it), else one file. Another scheme than `file://` is refused.
fn copy_target(url: &str) -> Result<(std::path::PathBuf, crate::data::write_guard::OutputKind)> {
    use crate::data::write_guard::OutputKind;
    let path = match url.split_once("://") {
        None => url,
        Some(("file", rest)) => rest,
        Some((scheme, _)) => {
            return Err(EngineError::WriteRefused(format!(
                "COPY ... TO '{url}': aisql writes local files only, not {scheme}://"
            )));
        }
    };
    let path = std::path::PathBuf::from(path);
    let kind = if url.ends_with('/') || path.extension().is_none() {
        OutputKind::Folder
    } else {
        OutputKind::File
    };
    Ok((path, kind))
}
