//! Top-10 cosine search over N seeded vectors: the HNSW index against the
//! flat (exact) search. Prints the graph's build time, recall@10 against
//! the exact answer, and queries per second of both, on two seeded sets:
//! `random` (independent normal components: uniform directions, no
//! structure, the worst case for any graph index) and `clustered` (a centre
//! per 100 vectors, each vector as far from its centre as centres are from
//! the origin; queries drawn around the same centres): closer to embeddings,
//! whose neighbours are structured.
//!
//! Not a criterion benchmark: one graph build is the expensive part (minutes
//! at 100k × 1024 on two cores) and recall is a quality figure, not a time.
//! Sizes from the environment: `AISQL_VS_N` (vectors, default 100,000),
//! `AISQL_VS_DIMS` (default 1024), `AISQL_VS_QUERIES` (default 200),
//! `AISQL_VS_DATA` (`random` or `clustered`, default both), and the graph's
//! `AISQL_VS_M`, `AISQL_VS_EF_C`, `AISQL_VS_EF` (default: `HnswParams`'s;
//! `AISQL_VS_EF` may list several, `100,200,400`, each searched on one graph).
//!
//!     cargo bench -p aisql-vector --bench vector_search
//!     AISQL_VS_N=20000 cargo bench -p aisql-vector --bench vector_search

use std::time::Instant;

use aisql_vector::sample::{clustered, random};
use aisql_vector::{HnswParams, Query, VectorIndex, Vectors, flat_search, recall};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let n = env("AISQL_VS_N", 100_000);
    let dims = env("AISQL_VS_DIMS", 1024);
    let queries = env("AISQL_VS_QUERIES", 200);
    let defaults = HnswParams::default();
    let params = HnswParams {
        m: env("AISQL_VS_M", defaults.m),
        ef_construction: env("AISQL_VS_EF_C", defaults.ef_construction),
        ef_search: defaults.ef_search,
    };
    let efs: Vec<usize> = std::env::var("AISQL_VS_EF")
        .ok()
        .map(|v| v.split(',').filter_map(|e| e.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![defaults.ef_search]);
    let data = std::env::var("AISQL_VS_DATA").unwrap_or_default();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "top-10 cosine, {n} x {dims}, {queries} queries, {threads} threads, m {} ef_construction {}",
        params.m, params.ef_construction
    );
    for kind in ["random", "clustered"] {
        if !data.is_empty() && data != kind {
            continue;
        }
        let (base, qs) = match kind {
            "random" => (random(1, n, dims), random(2, queries, dims)),
            _ => (
                // A centre per 100 vectors, points as far from it as
                // centres are from the origin: neighbourhoods overlap.
                clustered(3, 4, n, dims, (n / 100).max(1), 1.0),
                clustered(3, 5, queries, dims, (n / 100).max(1), 1.0),
            ),
        };
        let mut vectors = Vectors::new(dims);
        for (row, v) in base.chunks_exact(dims).enumerate() {
            vectors
                .push(row as u64, v)
                .expect("seeded vectors are searchable");
        }
        drop(base);
        let qs: Vec<Query> = qs
            .chunks_exact(dims)
            .map(|q| Query::new(q, dims).expect("seeded query"))
            .collect();

        let started = Instant::now();
        let index = VectorIndex::hnsw(vectors, params);
        let build = started.elapsed().as_secs_f64();

        let started = Instant::now();
        let exact: Vec<_> = qs
            .iter()
            .map(|q| flat_search(index.vectors(), q, 10))
            .collect();
        let flat_s = started.elapsed().as_secs_f64();

        println!(
            "{kind:>9}: build {build:.1} s ({:.0} vectors/s), flat {:.1} q/s",
            n as f64 / build,
            qs.len() as f64 / flat_s,
        );
        for &ef in &efs {
            let started = Instant::now();
            let found: Vec<_> = qs.iter().map(|q| index.search_with_ef(q, 10, ef)).collect();
            let hnsw_s = started.elapsed().as_secs_f64();
            let r = found
                .iter()
                .zip(&exact)
                .map(|(f, e)| recall(f, e))
                .sum::<f64>()
                / qs.len() as f64;
            println!(
                "{kind:>9}: ef {ef}: recall@10 {r:.4}, hnsw {:.1} q/s (one thread)",
                qs.len() as f64 / hnsw_s,
            );
        }
    }
}
