//! `aisql explain`: the operator tree of a plan, root first, with operator ids,
//! aliases, tables, shortened prompts and labels.

use std::fmt::Write;

use crate::quailb::plan::{Operator, PlanTree, QueryPlan};
use aisql_engine::inference::prompt::shorten;

/// Widest prompt excerpt shown.
const PROMPT_WIDTH: usize = 72;

/// Renders the operator tree of `query`.
pub fn explain(query: &QueryPlan) -> String {
    let mut out = String::new();
    let names = query.output_names().join(", ");
    let _ = writeln!(out, "Output [{names}]");
    let select: Vec<String> = query
        .select
        .iter()
        .map(|s| format!("{}.{} AS {}", s.alias, s.column, s.name))
        .collect();
    let _ = writeln!(out, "└─ Project [{}]", select.join(", "));
    for (i, line) in tree_lines(query, &query.tree).iter().enumerate() {
        let _ = writeln!(out, "   {}{line}", if i == 0 { "└─ " } else { "   " });
    }
    out
}

/// Lines of a subtree, the first unindented, children indented below it.
fn tree_lines(query: &QueryPlan, tree: &PlanTree) -> Vec<String> {
    let (head, children) = match tree {
        PlanTree::Scan(i) => {
            let relation = &query.relations[*i];
            let head = format!(
                "Scan {} AS {} [{}] text={}",
                relation.table,
                relation.alias,
                relation.columns.join(", "),
                relation.text_column
            );
            (head, &[][..])
        }
        PlanTree::Operator(i, children) => (describe(&query.operators[*i]), &children[..]),
    };
    let mut lines = vec![head];
    for (i, child) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        for (j, line) in tree_lines(query, child).into_iter().enumerate() {
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
