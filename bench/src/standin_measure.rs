//! A measurement of the stand-in generator (ignored; run by hand): time and size per
//! table, token lengths per text column, TRUE rates per predicate. Here rather than in
//! `aisql-standin` because it reads the result through this crate's layout reader.
//!
//! Measurement run (not part of the normal suite):
//! `AISQL_STANDIN_SF=1.0 AISQL_STANDIN_DIR=/tmp/x cargo test -p aisql-bench --release -- --ignored --nocapture measure_generation`.

use std::fs::File;
use std::path::{Path, PathBuf};

use aisql_engine::inference::backend::AiKind;
use aisql_standin::{generate, predicates};
use datafusion::arrow::array::{Array, AsArray};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

#[test]
#[ignore]
fn measure_generation() {
    let sf: f64 = std::env::var("AISQL_STANDIN_SF")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.1);
    let tmp = tempfile::tempdir().unwrap();
    let root = std::env::var_os("AISQL_STANDIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let s = generate(&root, sf).unwrap();
    eprintln!(
        "sf {sf}: corpus {} collection {} total {:.1} s",
        s.corpus_id, s.collection_id, s.seconds
    );
    let mut table_bytes = 0;
    for (t, x) in &s.tables {
        table_bytes += x.bytes;
        eprintln!(
            "  {t:18} rows {:7} bytes {:11} seconds {:6.1}",
            x.rows, x.bytes, x.seconds
        );
    }
    eprintln!(
        "  tables {} bytes; labels {} rows, {} bytes, {:.1} s",
        table_bytes,
        s.label_rows.values().sum::<u64>(),
        s.label_bytes,
        s.label_seconds
    );
    let tok = aisql_models::tokenizer::Tokenizer::vendored().unwrap();
    let cdir = root.join("corpora").join(&s.corpus_id);
    for (t, col) in [
        ("reviews", "body"),
        ("reports", "report"),
        ("terms", "term"),
        ("claims", "claim"),
        ("evidence", "text"),
        ("citation_contexts", "destination_context"),
        ("citation_passages", "passage_text"),
        ("agent_traces", "token_count"),
    ] {
        let f = File::open(cdir.join(format!("{t}.parquet"))).unwrap();
        let mut lens: Vec<usize> = Vec::new();
        for b in ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .build()
            .unwrap()
        {
            let b = b.unwrap();
            let c = b.column_by_name(col).unwrap();
            if t == "agent_traces" {
                let a = c.as_primitive::<datafusion::arrow::datatypes::Int32Type>();
                lens.extend((0..a.len()).map(|i| a.value(i) as usize));
            } else {
                let a = c.as_string::<i32>();
                let texts: Vec<&str> = (0..a.len()).map(|i| a.value(i)).collect();
                lens.extend(tok.encode_batch(&texts).unwrap().iter().map(Vec::len));
            }
        }
        lens.sort_unstable();
        let n = lens.len();
        let q = |p: f64| lens[((n as f64 - 1.0) * p).round() as usize];
        eprintln!(
            "  tokens {t:18} mean {:8.1} median {:6} p90 {:6} p95 {:6} max {:6}",
            lens.iter().sum::<usize>() as f64 / n as f64,
            q(0.5),
            q(0.9),
            q(0.95),
            q(1.0)
        );
    }
    // Label rates.
    let ds = crate::layout::Dataset::open(&root, sf, None).unwrap();
    let store = ds.load_labels(None).unwrap();
    for p in predicates() {
        let set = store.for_template(p.template).unwrap();
        let rows = &ds.table_rows;
        let mut trues = 0usize;
        let mut total = 0usize;
        if p.kind != AiKind::Classify {
            let ls = &ds.tables;
            let _ = ls;
            let left: Vec<String> = read_ids(&ds.tables[p.left.0]);
            let right: Option<Vec<String>> = p.right.map(|r| read_ids(&ds.tables[r.0]));
            for l in &left {
                match &right {
                    None => {
                        total += 1;
                        trues += set.get_bool(l, None).unwrap() as usize;
                    }
                    Some(rs) => {
                        for r in rs {
                            total += 1;
                            trues += set.get_bool(l, Some(r)).unwrap() as usize;
                        }
                    }
                }
            }
            eprintln!(
                "  {:24} {:9} labels, TRUE rate {:.4}",
                p.name,
                total,
                trues as f64 / total as f64
            );
        } else {
            eprintln!(
                "  {:24} {:9} labels (rows {})",
                p.name,
                set.len(),
                rows[p.left.0]
            );
        }
    }
}

fn read_ids(path: &Path) -> Vec<String> {
    let f = File::open(path).unwrap();
    let mut out = Vec::new();
    for b in ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap()
    {
        let b = b.unwrap();
        let a = b.column_by_name("id").unwrap().as_string::<i32>();
        out.extend((0..a.len()).map(|i| a.value(i).to_string()));
    }
    out
}
