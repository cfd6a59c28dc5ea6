//! Comparing two runs query by query (`aisql bench compare A B`): runtime ratio,
//! token and regret deltas, output precision/recall deltas, and per filter/join
//! predicate the answers both runs gave on the same tuples, scored against the
//! labels with an exact two-sided McNemar test (binomial on discordant pairs).

use std::collections::HashMap;
use std::path::Path;

use aisql_engine::inference::backend::AiKind;
use serde::Serialize;

use crate::driver::verify_run_files;
use crate::error::{BenchError, Result};
use crate::layout::Dataset;
use crate::metrics::QueryStatus;
use crate::report::g6;
use crate::run_file::{QueryRecord, RunFile, read_saved_plan};
use crate::scoring::SavedQuery;

/// Exact two-sided McNemar p-value for `b` and `c` discordant pairs:
/// `min(1, 2 · P[X ≤ min(b, c)])` with `X ~ Binomial(b + c, 1/2)`; 1 when `b + c = 0`.
pub fn mcnemar_exact(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // log pmf(i) iteratively; sum in log space to survive large n.
    let mut log_pmf = -(n as f64) * std::f64::consts::LN_2;
    let mut terms = Vec::with_capacity(k as usize + 1);
    for i in 0..=k {
        terms.push(log_pmf);
        log_pmf += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
    }
    let max = terms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let tail = max.exp() * terms.iter().map(|t| (t - max).exp()).sum::<f64>();
    (2.0 * tail).min(1.0)
}

/// One predicate evaluated in both runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PredicateComparison {
    /// Operator id.
    pub operator_id: String,
    /// Predicate key of the labels.
    pub predicate_key: String,
    /// Tuples both runs answered.
    pub paired: u64,
    /// A agreed with the label, B did not.
    pub a_correct_b_wrong: u64,
    /// B agreed with the label, A did not.
    pub a_wrong_b_correct: u64,
    /// Exact McNemar p-value.
    pub p_value: f64,
}

/// One query in both runs. Deltas are B − A; null when either side lacks the value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueryComparison {
    /// Query id.
    pub id: String,
    /// Status in A and in B.
    pub status: (String, String),
    /// runtime B / runtime A.
    pub runtime_ratio: Option<f64>,
    /// Input tokens B − A.
    pub input_tokens_delta: Option<i64>,
    /// Fresh tokens B − A.
    pub fresh_tokens_delta: Option<i64>,
    /// Minimum tokens B − A.
    pub minimum_tokens_delta: Option<i64>,
    /// KV regret percentage points B − A.
    pub kv_regret_percent_delta: Option<f64>,
    /// Output precision B − A.
    pub precision_delta: Option<f64>,
    /// Output recall B − A.
    pub recall_delta: Option<f64>,
    /// Filter/join predicates answered in both.
    pub predicates: Vec<PredicateComparison>,
}

/// The comparison of two runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunComparison {
    /// Run A folder.
    pub a: String,
    /// Run B folder.
    pub b: String,
    /// Queries present in both, in A's order.
    pub queries: Vec<QueryComparison>,
}

fn delta_i(a: Option<u64>, b: Option<u64>) -> Option<i64> {
    Some(b? as i64 - a? as i64)
}

fn delta_f(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(crate::metrics::r6(b? - a?))
}

fn predicates(
    dir_a: &Path,
    qa: &QueryRecord,
    dir_b: &Path,
    qb: &QueryRecord,
    labels: &crate::quailb::labels::LabelStore,
    templates: &HashMap<String, String>,
) -> Result<Vec<PredicateComparison>> {
    let (Some(fa), Some(fb)) = (&qa.files, &qb.files) else {
        return Ok(Vec::new());
    };
    let sa = SavedQuery::load(dir_a, fa)?;
    let sb = SavedQuery::load(dir_b, fb)?;
    let mut out = Vec::new();
    for ta in sa.answers.iter().filter(|t| t.kind != AiKind::Classify) {
        let Some(tb) = sb.answers_of(&ta.op_id) else {
            continue;
        };
        let Some(set) = templates
            .get(&format!("{}/{}", qa.id, ta.op_id))
            .and_then(|t| labels.for_template(t))
        else {
            continue;
        };
        let key = |t: &aisql_engine::exec::answers::AnswerTable, r: usize| -> Vec<String> {
            t.ids.iter().map(|c| c[r].clone()).collect()
        };
        let b_answers: HashMap<Vec<String>, bool> = (0..tb.len())
            .filter_map(|r| Some((key(tb, r), tb.decision(r)?)))
            .collect();
        let (mut paired, mut ab, mut ba) = (0u64, 0u64, 0u64);
        for r in 0..ta.len() {
            let k = key(ta, r);
            let Some(&b) = b_answers.get(&k) else {
                continue;
            };
            let Some(label) = set.get_bool(&k[0], k.get(1).map(String::as_str)) else {
                continue;
            };
            paired += 1;
            let Some(a) = ta.decision(r) else {
                continue;
            };
            let (a_ok, b_ok) = (a == label, b == label);
            ab += u64::from(a_ok && !b_ok);
            ba += u64::from(!a_ok && b_ok);
        }
        out.push(PredicateComparison {
            operator_id: ta.op_id.clone(),
            predicate_key: set.info.key.clone(),
            paired,
            a_correct_b_wrong: ab,
            a_wrong_b_correct: ba,
            p_value: mcnemar_exact(ab, ba),
        });
    }
    Ok(out)
}

/// Compares runs `a` and `b` (same corpus); `dataset` supplies the labels.
pub fn compare_runs(a: &Path, b: &Path, dataset: &Dataset) -> Result<RunComparison> {
    let ra = RunFile::read(a)?;
    let rb = RunFile::read(b)?;
    verify_run_files(a, &ra)?;
    verify_run_files(b, &rb)?;
    if ra.corpus_id != rb.corpus_id {
        return Err(BenchError::Run {
            dir: b.to_path_buf(),
            message: format!(
                "used corpus {}, run {} used {}: compare runs of one corpus",
                rb.corpus_id,
                a.display(),
                ra.corpus_id
            ),
        });
    }
    if ra.corpus_id != dataset.corpus_id {
        return Err(BenchError::Run {
            dir: a.to_path_buf(),
            message: format!(
                "used corpus {}, the data found is {} (pass the runs' --root and --sf)",
                ra.corpus_id, dataset.corpus_id
            ),
        });
    }
    // Templates of every AI operator, from the saved plans of run A.
    let mut templates = HashMap::new();
    for q in &ra.queries {
        let Some(f) = &q.files else { continue };
        let plan = read_saved_plan(a, f)?;
        for op in &plan.operators {
            if let Some(t) = op.template() {
                templates.insert(format!("{}/{}", q.id, op.id()), t.to_string());
            }
        }
    }
    let mut wanted: Vec<String> = templates.values().cloned().collect();
    wanted.sort();
    wanted.dedup();
    let labels = dataset.load_labels(Some(&wanted))?;
    let mut queries = Vec::new();
    for qa in &ra.queries {
        let Some(qb) = rb.query(&qa.id) else { continue };
        let (ma, mb) = (qa.metrics.as_ref(), qb.metrics.as_ref());
        let ok = |q: &QueryRecord| q.status == QueryStatus::Complete;
        let (ma, mb) = (ma.filter(|_| ok(qa)), mb.filter(|_| ok(qb)));
        let runtime_ratio = match (qa.runtime_s, qb.runtime_s) {
            (Some(x), Some(y)) if x > 0.0 => Some(crate::metrics::r6(y / x)),
            _ => None,
        };
        queries.push(QueryComparison {
            id: qa.id.clone(),
            status: (qa.status.as_str().into(), qb.status.as_str().into()),
            runtime_ratio,
            input_tokens_delta: delta_i(
                ma.and_then(|m| m.input_tokens),
                mb.and_then(|m| m.input_tokens),
            ),
            fresh_tokens_delta: delta_i(
                ma.and_then(|m| m.fresh_tokens),
                mb.and_then(|m| m.fresh_tokens),
            ),
            minimum_tokens_delta: delta_i(
                ma.and_then(|m| m.minimum_tokens),
                mb.and_then(|m| m.minimum_tokens),
            ),
            kv_regret_percent_delta: delta_f(
                ma.and_then(|m| m.kv_regret_percent),
                mb.and_then(|m| m.kv_regret_percent),
            ),
            precision_delta: delta_f(
                ma.and_then(|m| m.accuracy.output_accuracy.as_ref())
                    .map(|o| o.precision),
                mb.and_then(|m| m.accuracy.output_accuracy.as_ref())
                    .map(|o| o.precision),
            ),
            recall_delta: delta_f(
                ma.and_then(|m| m.accuracy.output_accuracy.as_ref())
                    .map(|o| o.recall),
                mb.and_then(|m| m.accuracy.output_accuracy.as_ref())
                    .map(|o| o.recall),
            ),
            predicates: predicates(a, qa, b, qb, &labels, &templates)?,
        });
    }
    Ok(RunComparison {
        a: a.display().to_string(),
        b: b.display().to_string(),
        queries,
    })
}

/// The comparison as Markdown.
pub fn comparison_markdown(c: &RunComparison) -> String {
    let opt_f = |v: Option<f64>| v.map_or_else(|| "unavailable".to_string(), g6);
    let opt_i = |v: Option<i64>| v.map_or_else(|| "unavailable".to_string(), |x| format!("{x:+}"));
    let mut l = vec![
        "# QUAIL-B comparison".to_string(),
        String::new(),
        format!("A: {}", c.a),
        String::new(),
        format!("B: {}", c.b),
        String::new(),
        "Deltas are B − A; runtime ratio is B / A.".into(),
        String::new(),
        "## Queries".into(),
        String::new(),
        "| Query | Status A | Status B | Runtime ratio | Input tokens Δ | Fresh tokens Δ | Minimum tokens Δ | KV regret Δ (pp) | Precision Δ | Recall Δ |".into(),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |".into(),
    ];
    for q in &c.queries {
        l.push(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            q.id,
            q.status.0,
            q.status.1,
            opt_f(q.runtime_ratio),
            opt_i(q.input_tokens_delta),
            opt_i(q.fresh_tokens_delta),
            opt_i(q.minimum_tokens_delta),
            opt_f(q.kv_regret_percent_delta),
            opt_f(q.precision_delta),
            opt_f(q.recall_delta),
        ));
    }
    l.extend([
        String::new(),
        "## Predicates (exact McNemar test on answers both runs gave)".into(),
        String::new(),
        "| Query | Operator | Predicate | Paired answers | A right, B wrong | A wrong, B right | p |".into(),
        "| --- | --- | --- | --- | --- | --- | --- |".into(),
    ]);
    for q in &c.queries {
        for p in &q.predicates {
            l.push(format!(
                "| {} | {} | {} | {} | {} | {} | {} |",
                q.id,
                p.operator_id,
                p.predicate_key,
                p.paired,
                p.a_correct_b_wrong,
                p.a_wrong_b_correct,
                g6(p.p_value)
            ));
        }
    }
    l.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::mcnemar_exact;

    #[test]
    fn mcnemar_matches_hand_computed_binomial_tails() {
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        // b=1, c=5: n=6, P[X<=1] = (1+6)/64 = 7/64; two-sided 14/64 = 0.21875.
        assert!((mcnemar_exact(1, 5) - 0.21875).abs() < 1e-12);
        assert!((mcnemar_exact(5, 1) - 0.21875).abs() < 1e-12);
        // b=0, c=10: 2/1024.
        assert!((mcnemar_exact(0, 10) - 2.0 / 1024.0).abs() < 1e-12);
        // Equal counts cap at 1.
        assert_eq!(mcnemar_exact(3, 3), 1.0);
        // b=2, c=8: n=10, P[X<=2] = (1+10+45)/1024 = 56/1024; p = 112/1024.
        assert!((mcnemar_exact(2, 8) - 112.0 / 1024.0).abs() < 1e-12);
        // Large n stays finite.
        let p = mcnemar_exact(5000, 5200);
        assert!(p > 0.0 && p < 1.0, "{p}");
    }
}
