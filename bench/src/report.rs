//! `report.md` and `measurements.parquet` of a run (SPEC §D.6). Missing values
//! are `null` in Parquet and `unavailable` in the report, never 0.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use crate::error::Result;
use crate::metrics::{QueryMetrics, QueryStatus};
use crate::run_file::{QueryRecord, RunFile, write_atomic};

/// File name of the report.
pub const REPORT_MD: &str = "report.md";
/// File name of the per-query measurements.
pub const MEASUREMENTS_PARQUET: &str = "measurements.parquet";

/// `x` with 6 significant digits, like C's `%.6g`.
pub fn g6(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    if !x.is_finite() {
        return x.to_string();
    }
    let sci = format!("{x:.5e}");
    let (mant, exp) = sci.split_once('e').expect("scientific notation");
    let exp: i32 = exp.parse().expect("exponent");
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mant), exp.abs())
    } else {
        trim(&format!("{x:.*}", (5 - exp) as usize))
    }
}

fn num(x: Option<f64>) -> String {
    x.map_or_else(|| "unavailable".to_string(), g6)
}

fn int(x: Option<u64>) -> String {
    x.map_or_else(|| "unavailable".to_string(), |v| v.to_string())
}

fn metrics(q: &QueryRecord) -> Option<&QueryMetrics> {
    if q.status == QueryStatus::Complete {
        q.metrics.as_ref()
    } else {
        None
    }
}

/// Under `--keep-kv on` or `--kv-store` (queries found the KV earlier ones
/// left, in memory or on disk): the whole
/// run's fresh tokens against the sum of the queries' minimums, each of
/// which assumes the query starts from nothing. Empty for a run whose
/// queries each started from nothing.
fn kept_kv_section(run: &RunFile) -> Vec<String> {
    let kept = run.queries.iter().any(|q| {
        q.measurements.as_ref().is_some_and(|w| {
            w.kv_kept_across_queries.as_ref().is_some_and(|k| k.0)
                || w.kv_store_read_tokens.is_some_and(|n| n.0 > 0)
        })
    });
    if !kept {
        return Vec::new();
    }
    let complete: Vec<&QueryMetrics> = run
        .queries
        .iter()
        .filter(|q| q.status == QueryStatus::Complete)
        .filter_map(metrics)
        .collect();
    let fresh: u64 = complete.iter().filter_map(|m| m.fresh_tokens).sum();
    let minimum: u64 = complete.iter().filter_map(|m| m.minimum_tokens).sum();
    let saving = (minimum > 0).then(|| 100.0 * (1.0 - fresh as f64 / minimum as f64));
    vec![
        String::new(),
        "## KV kept across queries".into(),
        String::new(),
        "Queries ran with `--keep-kv on` or `--kv-store`: each found the KV the queries before \
         it left (in memory, or in the on-disk store), so a query's fresh tokens may fall below \
         its minimum (which assumes it starts from nothing) and its KV regret is not the \
         benchmark's."
            .into(),
        String::new(),
        "| Complete queries | Fresh tokens, whole run | Σ minimum tokens | Saving across queries (%) |"
            .into(),
        "| --- | --- | --- | --- |".into(),
        format!(
            "| {} | {} | {} | {} |",
            complete.len(),
            fresh,
            minimum,
            num(saving)
        ),
    ]
}

/// The report text.
pub fn report_markdown(run: &RunFile, charts: &[(String, String)]) -> String {
    let status = match run.status {
        crate::run_file::RunStatus::Running => "running",
        crate::run_file::RunStatus::Complete => "complete",
        crate::run_file::RunStatus::Failed => "failed",
    };
    let complete = run
        .queries
        .iter()
        .filter(|q| q.status == QueryStatus::Complete)
        .count();
    let mut l: Vec<String> = vec![
        "# QUAIL-B results".into(),
        String::new(),
        format!("Status: {status} ({complete} of {} queries complete)", run.queries.len()),
        String::new(),
        format!("Scale factor: {}", run.scale_factor),
        String::new(),
        format!("Corpus: {}", run.corpus_id),
        String::new(),
        format!("Reference collection: {}", run.collection_id.as_deref().unwrap_or("unavailable")),
        String::new(),
        format!("Reference model: {}", run.reference_model),
        String::new(),
        "Query duration excludes model startup, result collection, scoring, and result saving.".into(),
        String::new(),
        "Predicate accuracy is agreement on evaluated answers. Engines may evaluate different documents and pairs."
            .into(),
        String::new(),
        "## Query results".into(),
        String::new(),
        "| Query | Status | Seconds | $/query | Throughput | Unit | Input tokens/s | $/million input tokens | KV regret (%) |"
            .into(),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |".into(),
    ];
    for q in &run.queries {
        let m = metrics(q);
        l.push(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            q.id,
            q.status.as_str(),
            num(q.runtime_s),
            num(m.and_then(|m| m.cost_usd)),
            num(m.and_then(|m| m.throughput.value())),
            m.map_or("unavailable", |m| m.throughput.unit()),
            num(m.and_then(|m| m.input_tokens_per_second)),
            num(m.and_then(|m| m.cost_usd_per_million_input_tokens)),
            num(m.and_then(|m| m.kv_regret_percent)),
        ));
    }
    l.extend([
        String::new(),
        "## Accuracy".into(),
        String::new(),
        "| Query | Predicate accuracy | Evaluated answers | Label accuracy | Evaluated labels | Output precision | Output recall |"
            .into(),
        "| --- | --- | --- | --- | --- | --- | --- |".into(),
    ]);
    for q in &run.queries {
        let a = metrics(q).map(|m| &m.accuracy);
        let answers = a.map(|a| &a.answer_accuracy);
        let labels = a.map(|a| &a.label_accuracy);
        l.push(format!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            q.id,
            num(answers.filter(|c| c.evaluated > 0).map(|c| c.accuracy)),
            int(answers.map(|c| c.evaluated)),
            num(labels.and_then(|c| c.accuracy)),
            int(labels.map(|c| c.evaluated)),
            num(a
                .and_then(|a| a.output_accuracy.as_ref())
                .map(|o| o.precision)),
            num(a.and_then(|a| a.output_accuracy.as_ref()).map(|o| o.recall)),
        ));
    }
    l.extend([
        String::new(),
        "## Assessment".into(),
        String::new(),
        "| Query | Assessment | Reasons |".into(),
        "| --- | --- | --- |".into(),
    ]);
    for q in &run.queries {
        let (verdict, reasons) = match &q.assessment {
            Some(a) => (
                match a.verdict {
                    crate::metrics::Verdict::Good => "good",
                    crate::metrics::Verdict::Bad => "bad",
                },
                a.reasons
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            None => ("unavailable", String::new()),
        };
        l.push(format!("| {} | {verdict} | {reasons} |", q.id));
    }
    l.extend(summaries_section(run));
    l.extend([
        String::new(),
        "## Input rows and token counts".into(),
        String::new(),
        "Restored KV tokens came back from the host memory tier by copy: neither fresh nor recomputed. \
         Speculative tokens were computed to ask a document, before its KV was dropped, the questions \
         a later operator would ask it (look-ahead); they are part of the fresh tokens, and so are \
         those of the speculative questions no operator asked for (unused). \
         Peak RSS is aisql's resident memory while the query ran, was saved and scored."
            .into(),
        String::new(),
        "| Query | Input rows by alias | Input tokens | Fresh tokens | Minimum tokens | Recomputed KV tokens | KV regret (%) | Restored KV tokens | Speculative tokens | Unused speculative questions | Result rows | Peak RSS (GiB) |".into(),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |".into(),
    ]);
    for q in &run.queries {
        let m = metrics(q);
        let rows = m.map_or_else(
            || "unavailable".to_string(),
            |m| {
                m.input_rows
                    .iter()
                    .map(|(a, n)| format!("{a}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        );
        let work = q.measurements.as_ref();
        let restored = m.and(work.and_then(|w| w.restored_tokens).map(|s| s.0));
        let speculative = m.and(work.and_then(|w| w.speculative_tokens).map(|s| s.0));
        let unused = m.and(work.and_then(|w| w.speculative_unused).map(|s| s.0));
        let peak = work
            .and_then(|w| w.peak_rss_bytes)
            .map(|b| b.0 as f64 / (1u64 << 30) as f64);
        l.push(format!(
            "| {} | {rows} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            q.id,
            int(m.and_then(|m| m.input_tokens)),
            int(m.and_then(|m| m.fresh_tokens)),
            int(m.and_then(|m| m.minimum_tokens)),
            m.and_then(|m| m.regret_tokens)
                .map_or_else(|| "unavailable".to_string(), |v| v.to_string()),
            num(m.and_then(|m| m.kv_regret_percent)),
            int(restored),
            int(speculative),
            int(unused),
            int(m
                .and_then(|m| m.accuracy.output_accuracy.as_ref())
                .map(|o| o.predicted_rows)),
            num(peak),
        ));
    }
    l.extend(estimates_section(run));
    l.extend(workers_section(run));
    if !charts.is_empty() {
        l.extend([String::new(), "## Charts".into(), String::new()]);
        for (title, file) in charts {
            l.push(format!("![{title}]({file})"));
            l.push(String::new());
        }
        l.pop();
    }
    l.extend(kept_kv_section(run));
    l.extend([
        String::new(),
        "## Configuration".into(),
        String::new(),
        "```json".into(),
        serde_json::to_string_pretty(&run.metadata).unwrap_or_default(),
        "```".into(),
    ]);
    let errors: Vec<&QueryRecord> = run.queries.iter().filter(|q| q.error.is_some()).collect();
    if !errors.is_empty() {
        l.extend([String::new(), "## Errors".into(), String::new()]);
        for q in errors {
            l.push(format!(
                "- {}: {}",
                q.id,
                q.error.as_deref().unwrap_or_default()
            ));
        }
    }
    l.join("\n") + "\n"
}

/// The balance of a run on several workers: per query, each worker's fresh
/// tokens and the largest over their mean. Nothing for a run on one worker.
/// The queries whose rows did not fit the disk: their count and hash instead
/// of `rows.parquet`, and why (empty when every result was saved).
fn summaries_section(run: &RunFile) -> Vec<String> {
    let kept: Vec<_> = run
        .queries
        .iter()
        .filter_map(|q| Some((q, q.files.as_ref()?.rows_summary.as_ref()?)))
        .collect();
    if kept.is_empty() {
        return Vec::new();
    }
    let mut l = vec![
        String::new(),
        "## Results kept as a summary".into(),
        String::new(),
        format!(
            "These results would not have fit the disk: their rows were counted and hashed, not saved, \
             and so not compared with the reference (assessment RESULT_NOT_SAVED). The hash is {}",
            aisql_engine::data::row_digest::ROWS_HASH
        ),
        String::new(),
        "| Query | Rows | Rows hash | Rows written before the disk ran low | Free bytes then | Reserve (bytes) |".into(),
        "| --- | --- | --- | --- | --- | --- |".into(),
    ];
    for (q, s) in kept {
        l.push(format!(
            "| {} | {} | {} | {} | {} | {} |",
            q.id, s.rows, s.rows_hash, s.rows_before_disk_ran_low, s.free_bytes, s.reserve_bytes
        ));
    }
    l
}

/// Each query's estimate beside what it did: fresh tokens and seconds, with
/// the estimate's error (estimate − actual, in % of actual); nothing when no
/// query was estimated.
fn estimates_section(run: &RunFile) -> Vec<String> {
    if run.queries.iter().all(|q| q.estimate.is_none()) {
        return Vec::new();
    }
    let mut l = vec![
        String::new(),
        "## Estimates".into(),
        String::new(),
        "Each query was estimated before it ran (`--estimate`: the scheduler over a virtual KV, \
         the answers of a seeded sample); seconds are estimated only with a throughput profile \
         (`aisql model calibrate`). Error = (estimate − actual) / actual."
            .into(),
        String::new(),
        "| Query | Estimated fresh tokens | Fresh tokens | Error (%) | Estimated seconds | Seconds | Error (%) |"
            .into(),
        "| --- | --- | --- | --- | --- | --- | --- |".into(),
    ];
    let error = |est: Option<f64>, actual: Option<f64>| match (est, actual) {
        (Some(e), Some(a)) if a > 0.0 => num(Some(100.0 * (e - a) / a)),
        _ => "unavailable".to_string(),
    };
    for q in &run.queries {
        let Some(e) = &q.estimate else { continue };
        let fresh = q
            .measurements
            .as_ref()
            .and_then(|m| m.fresh_tokens)
            .map(|s| s.0);
        l.push(format!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            q.id,
            e.fresh_tokens,
            int(fresh),
            error(Some(e.fresh_tokens as f64), fresh.map(|f| f as f64)),
            num(e.seconds),
            num(q.runtime_s),
            error(e.seconds, q.runtime_s),
        ));
    }
    l
}

fn workers_section(run: &RunFile) -> Vec<String> {
    let per_query: Vec<(&str, Vec<u64>, Option<f64>)> = run
        .queries
        .iter()
        .filter_map(|q| {
            let m = q.measurements.as_ref()?;
            let fresh = m
                .workers
                .as_ref()?
                .0
                .iter()
                .map(|w| w.fresh_tokens)
                .collect::<Option<Vec<u64>>>()?;
            let balance = m.worker_fresh_max_over_mean.map(|b| b.0);
            Some((q.id.as_str(), fresh, balance))
        })
        .collect();
    if per_query.is_empty() {
        return Vec::new();
    }
    let mut l = vec![
        String::new(),
        "## Workers".into(),
        String::new(),
        "Each document's questions ran on one worker. Balance is the largest worker's fresh \
         tokens over the mean of all workers (1 is perfect)."
            .into(),
        String::new(),
        "| Query | Fresh tokens per worker | Max/mean |".into(),
        "| --- | --- | --- |".into(),
    ];
    for (id, fresh, balance) in per_query {
        let list: Vec<String> = fresh.iter().map(u64::to_string).collect();
        l.push(format!("| {id} | {} | {} |", list.join(", "), num(balance)));
    }
    l
}

/// `measurements.parquet`: one row per complete query.
pub fn measurements_batch(run: &RunFile) -> Result<RecordBatch> {
    let done: Vec<(&QueryRecord, &QueryMetrics)> = run
        .queries
        .iter()
        .filter_map(|q| metrics(q).map(|m| (q, m)))
        .collect();
    let i64s = |f: &dyn Fn(&QueryMetrics) -> Option<i64>| -> ArrayRef {
        Arc::new(Int64Array::from(
            done.iter().map(|(_, m)| f(m)).collect::<Vec<_>>(),
        ))
    };
    let f64s = |f: &dyn Fn(&QueryMetrics) -> Option<f64>| -> ArrayRef {
        Arc::new(Float64Array::from(
            done.iter().map(|(_, m)| f(m)).collect::<Vec<_>>(),
        ))
    };
    let u = |v: Option<u64>| v.map(|x| x as i64);
    let columns: Vec<(&str, ArrayRef)> = vec![
        (
            "query",
            Arc::new(StringArray::from_iter_values(
                done.iter().map(|(q, _)| q.id.as_str()),
            )),
        ),
        ("runtime_s", f64s(&|m| Some(m.runtime_s))),
        ("input_tokens", i64s(&|m| u(m.input_tokens))),
        (
            "input_tokens_per_second",
            f64s(&|m| m.input_tokens_per_second),
        ),
        ("fresh_tokens", i64s(&|m| u(m.fresh_tokens))),
        ("minimum_tokens", i64s(&|m| u(m.minimum_tokens))),
        ("regret_tokens", i64s(&|m| m.regret_tokens)),
        (
            "regret_approximate",
            Arc::new(BooleanArray::from(
                done.iter()
                    .map(|(_, m)| Some(m.regret_approximate))
                    .collect::<Vec<_>>(),
            )),
        ),
        (
            "evaluated_document_pairs",
            i64s(&|m| u(m.evaluated_document_pairs)),
        ),
        (
            "input_rows",
            i64s(&|m| Some(m.input_rows.values().sum::<u64>() as i64)),
        ),
        (
            "answers_evaluated",
            i64s(&|m| Some(m.accuracy.answer_accuracy.evaluated as i64)),
        ),
        (
            "answers_correct",
            i64s(&|m| Some(m.accuracy.answer_accuracy.correct as i64)),
        ),
        (
            "labels_evaluated",
            i64s(&|m| Some(m.accuracy.label_accuracy.evaluated as i64)),
        ),
        (
            "labels_correct",
            i64s(&|m| Some(m.accuracy.label_accuracy.correct as i64)),
        ),
        (
            "predicted_rows",
            i64s(&|m| {
                m.accuracy
                    .output_accuracy
                    .as_ref()
                    .map(|o| o.predicted_rows as i64)
            }),
        ),
        (
            "expected_rows",
            i64s(&|m| {
                m.accuracy
                    .output_accuracy
                    .as_ref()
                    .map(|o| o.expected_rows as i64)
            }),
        ),
        (
            "matching_rows",
            i64s(&|m| {
                m.accuracy
                    .output_accuracy
                    .as_ref()
                    .map(|o| o.matching_rows as i64)
            }),
        ),
        ("cost_usd", f64s(&|m| m.cost_usd)),
        (
            "cost_usd_per_million_input_tokens",
            f64s(&|m| m.cost_usd_per_million_input_tokens),
        ),
        ("kv_regret_percent", f64s(&|m| m.kv_regret_percent)),
    ];
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), *n != "query"))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    debug_assert!(
        schema
            .fields()
            .iter()
            .all(|f| f.data_type() != &DataType::Null)
    );
    Ok(RecordBatch::try_new(
        schema,
        columns.into_iter().map(|(_, a)| a).collect(),
    )?)
}

/// Writes report.md, measurements.parquet and the charts into the run folder.
pub fn write_reports(dir: &Path, run: &RunFile) -> Result<()> {
    aisql_engine::data::files::write_parquet(
        &dir.join(MEASUREMENTS_PARQUET),
        &measurements_batch(run)?,
    )?;
    let charts = crate::charts::write_charts(dir, run).unwrap_or_else(|e| {
        log::warn!("charts not written: {e:#}");
        Vec::new()
    });
    write_atomic(
        &dir.join(REPORT_MD),
        report_markdown(run, &charts).as_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::g6;

    #[test]
    fn six_significant_digits_like_printf() {
        assert_eq!(g6(0.0), "0");
        assert_eq!(g6(1.0), "1");
        assert_eq!(g6(0.5), "0.5");
        assert_eq!(g6(123456.7), "123457");
        assert_eq!(g6(1234567.0), "1.23457e+06");
        assert_eq!(g6(0.0001), "0.0001");
        assert_eq!(g6(0.00001234), "1.234e-05");
        assert_eq!(g6(1.23456789), "1.23457");
        assert_eq!(g6(-2.5), "-2.5");
        assert_eq!(g6(999999.6), "1e+06");
    }
}
