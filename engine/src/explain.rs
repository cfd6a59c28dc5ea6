//! `aisql explain`: the operator tree of a plan, root first, with operator ids,
//! aliases, tables, shortened prompts and labels.

use std::fmt::Write;

use datafusion_substrait::substrait::proto::{Rel, plan_rel, rel};

use crate::plan::{Operator, QueryPlan};
use crate::prompt::shorten;

/// Widest prompt excerpt shown.
const PROMPT_WIDTH: usize = 72;

/// Renders the operator tree of `query`.
pub fn explain(query: &QueryPlan) -> String {
    let mut out = String::new();
    let names = query.output_names().join(", ");
    let _ = writeln!(out, "Output [{names}]");
    let Some(plan_rel::RelType::Root(root)) = query.substrait.relations[0].rel_type.as_ref() else {
        return out;
    };
    let Some(rel::RelType::Project(project)) =
        root.input.as_ref().and_then(|r| r.rel_type.as_ref())
    else {
        return out;
    };
    let select: Vec<String> = query
        .select
        .iter()
        .map(|s| format!("{}.{} AS {}", s.alias, s.column, s.name))
        .collect();
    let _ = writeln!(out, "└─ Project [{}]", select.join(", "));
    let mut walker = Walker {
        query,
        next: 0,
        scans: 0,
    };
    if let Some(input) = project.input.as_deref() {
        let lines = walker.rel(input);
        for (i, line) in lines.iter().enumerate() {
            let _ = writeln!(out, "   {}{line}", if i == 0 { "└─ " } else { "   " });
        }
    }
    out
}

struct Walker<'a> {
    query: &'a QueryPlan,
    /// Next operator in post-order.
    next: usize,
    /// Next relation in scan order.
    scans: usize,
}

impl Walker<'_> {
    /// Lines of the subtree, the first unindented, children indented below it.
    fn rel(&mut self, r: &Rel) -> Vec<String> {
        let children: Vec<&Rel> = match r.rel_type.as_ref() {
            Some(rel::RelType::Filter(f)) => f.input.as_deref().into_iter().collect(),
            Some(rel::RelType::Project(p)) => p.input.as_deref().into_iter().collect(),
            Some(rel::RelType::Join(j)) => j
                .left
                .as_deref()
                .into_iter()
                .chain(j.right.as_deref())
                .collect(),
            _ => Vec::new(),
        };
        let child_lines: Vec<Vec<String>> = children.into_iter().map(|c| self.rel(c)).collect();
        let head = match r.rel_type.as_ref() {
            Some(rel::RelType::Read(_)) => {
                let relation = &self.query.relations[self.scans];
                self.scans += 1;
                format!(
                    "Scan {} AS {} [{}] text={}",
                    relation.table,
                    relation.alias,
                    relation.columns.join(", "),
                    relation.text_column
                )
            }
            _ => {
                let op = &self.query.operators[self.next];
                self.next += 1;
                describe(op)
            }
        };
        let mut lines = vec![head];
        let n = child_lines.len();
        for (i, child) in child_lines.into_iter().enumerate() {
            let last = i + 1 == n;
            for (j, line) in child.into_iter().enumerate() {
                let prefix = match (j == 0, last) {
                    (true, true) => "└─ ",
                    (true, false) => "├─ ",
                    (false, true) => "   ",
                    (false, false) => "│  ",
                };
                lines.push(format!("{prefix}{line}"));
            }
        }
        lines
    }
}

fn describe(op: &Operator) -> String {
    match op {
        Operator::Filter {
            id,
            alias,
            template,
        } => format!(
            "AiFilter {id} on {alias}: {:?}",
            shorten(template, PROMPT_WIDTH)
        ),
        Operator::Join {
            id,
            aliases,
            template,
            on,
        } => {
            let mut s = format!(
                "AiJoin {id} {{0}}={} {{1}}={}: {:?}",
                aliases[0],
                aliases[1],
                shorten(template, PROMPT_WIDTH)
            );
            for (a, b) in on {
                let _ = write!(s, " AND {}.{a} = {}.{b}", aliases[0], aliases[1]);
            }
            s
        }
        Operator::Classify {
            id,
            alias,
            partner,
            template,
            labels,
            output,
            ..
        } => {
            let on = match partner {
                Some(p) => format!("{{0}}={alias} {{1}}={p}"),
                None => alias.clone(),
            };
            format!(
                "AiClassify {id} on {on} -> {alias}.{output}: {:?} labels [{}]",
                shorten(template, PROMPT_WIDTH),
                shorten(&labels.join(", "), PROMPT_WIDTH)
            )
        }
        Operator::InList {
            id,
            alias,
            output,
            accepted,
        } => format!("InList {id} {alias}.{output} IN [{}]", accepted.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn fev8_tree_shows_every_operator_and_scan() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/quailb/plans");
        let q = QueryPlan::from_file(&dir.join("FEV-8.json")).unwrap();
        let text = explain(&q);
        for needle in [
            "Output [c1, e1, c2, e2]",
            "AiJoin join-3 {0}=c2 {1}=e2",
            "AiJoin join-2 {0}=c2 {1}=e1",
            "Scan claims AS c1",
            "Scan evidence AS e2",
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
        let q = QueryPlan::from_file(&dir.join("IMDB-15.json")).unwrap();
        let text = explain(&q);
        assert!(
            text.contains("InList in-list-1 r.sentiment IN [negative, mixed]"),
            "{text}"
        );
        assert!(
            text.contains("AiClassify classify-2 on {0}=r {1}=a -> r.aspect_sentiment"),
            "{text}"
        );
    }
}
