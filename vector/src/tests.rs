//! The index against the flat (exact) search: recall@10 of the HNSW graph on
//! seeded random and clustered vectors, and the flat search's own contract
//! (the k smallest distances, ties in row order, all rows when k is large).

use super::sample::{clustered, random};
use super::{
    FLAT_BELOW, Hit, HnswParams, Query, VectorError, VectorIndex, Vectors, flat_search, recall,
};

/// `cosine_distance` as the engine's vector functions compute it (f64, sums
/// in component order).
fn cosine_distance(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    1.0 - dot / (norm(a) * norm(b))
}

fn vectors_of(flat: &[f32], dims: usize) -> Vectors {
    let mut v = Vectors::new(dims);
    for (row, x) in flat.chunks_exact(dims).enumerate() {
        v.push(row as u64, x)
            .expect("random vectors are searchable");
    }
    v
}

/// Mean recall@10 of `index` over `queries` against the flat search.
fn mean_recall(index: &VectorIndex, queries: &[f32], dims: usize) -> f64 {
    let mut total = 0.0;
    let n = queries.len() / dims;
    for q in queries.chunks_exact(dims) {
        let query = Query::new(q, dims).unwrap();
        let exact = flat_search(index.vectors(), &query, 10);
        let found = index.search(&query, 10);
        assert_eq!(found.len(), 10);
        // Distances are exact: the graph only chooses the candidates.
        for h in &found {
            let i = h.row as usize;
            let want = index.vectors().get(i);
            let d = cosine_distance(
                &want.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(),
                &q.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(),
            );
            assert_eq!(h.distance, d);
        }
        total += recall(&found, &exact);
    }
    total / n as f64
}

#[test]
fn hnsw_recall_on_random_vectors() {
    let (n, dims) = (20_000, 64);
    let index = VectorIndex::build(vectors_of(&random(1, n, dims), dims), HnswParams::default());
    assert!(index.is_approximate());
    let r = mean_recall(&index, &random(2, 100, dims), dims);
    eprintln!("random {n}x{dims}: recall@10 {r:.4}");
    assert!(r >= 0.95, "recall@10 {r}");
}

#[test]
fn hnsw_recall_on_clustered_vectors() {
    // At FLAT_BELOW: a graph, at half the random test's build time.
    let (n, dims) = (FLAT_BELOW, 64);
    let data = clustered(3, 4, n, dims, 200, 0.5);
    let index = VectorIndex::build(vectors_of(&data, dims), HnswParams::default());
    assert!(index.is_approximate());
    // Queries from the same clusters, not copies of rows.
    let r = mean_recall(&index, &clustered(3, 5, 100, dims, 200, 0.5), dims);
    eprintln!("clustered {n}x{dims}: recall@10 {r:.4}");
    assert!(r >= 0.95, "recall@10 {r}");
}

#[test]
fn flat_is_the_k_smallest_with_ties_in_row_order() {
    let dims = 4;
    let mut v = Vectors::new(dims);
    // Rows 0, 2 and 4 are one direction (distance 0 up to rounding, equal
    // to each other); rows 1 and 3 are further away.
    let rows: [[f32; 4]; 5] = [
        [1.0, 0.0, 0.0, 0.0],
        [0.0, 1.0, 0.0, 0.0],
        [2.0, 0.0, 0.0, 0.0],
        [1.0, 1.0, 0.0, 0.0],
        [3.0, 0.0, 0.0, 0.0],
    ];
    for (i, r) in rows.iter().enumerate() {
        v.push(i as u64, r).unwrap();
    }
    let q = Query::new(&[5.0, 0.0, 0.0, 0.0], dims).unwrap();
    let rows_of = |hits: Vec<Hit>| hits.iter().map(|h| h.row).collect::<Vec<_>>();
    assert_eq!(rows_of(flat_search(&v, &q, 2)), vec![0, 2]);
    assert_eq!(rows_of(flat_search(&v, &q, 4)), vec![0, 2, 4, 3]);
    // k past the set: every row, nearest first.
    assert_eq!(rows_of(flat_search(&v, &q, 100)), vec![0, 2, 4, 3, 1]);
    // An empty set: no rows.
    assert!(flat_search(&Vectors::new(dims), &q, 3).is_empty());
}

#[test]
fn flat_matches_a_full_sort() {
    let (n, dims) = (2_000, 16);
    let v = vectors_of(&random(7, n, dims), dims);
    let index = VectorIndex::build(v, HnswParams::default());
    assert!(!index.is_approximate(), "{n} < {FLAT_BELOW}: flat");
    for q in random(8, 10, dims).chunks_exact(dims) {
        let query = Query::new(q, dims).unwrap();
        let mut all = flat_search(index.vectors(), &query, n);
        assert_eq!(all.len(), n);
        let top = index.search(&query, 10);
        all.sort_by(|a, b| a.distance.total_cmp(&b.distance).then(a.row.cmp(&b.row)));
        assert_eq!(top, all[..10].to_vec());
    }
}

#[test]
fn bad_vectors_are_refused() {
    let mut v = Vectors::new(3);
    assert_eq!(
        v.push(0, &[1.0, 2.0]),
        Err(VectorError::Length { got: 2, want: 3 })
    );
    assert_eq!(v.push(0, &[0.0, 0.0, 0.0]), Err(VectorError::Zero));
    assert_eq!(
        v.push(0, &[f32::NAN, 0.0, 1.0]),
        Err(VectorError::NotFinite)
    );
    assert_eq!(
        Query::new(&[1.0; 4], 3).unwrap_err().to_string(),
        "the vector has 4 components, the search 3"
    );
    assert!(v.is_empty());
}
