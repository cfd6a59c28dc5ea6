//! Nearest neighbours of a query vector among a column's vectors, by cosine
//! distance: the search behind `ai_search` (`aisql-engine`'s
//! `sql/vector_search.rs`). A crate of its own, with no DataFusion, so that
//! its benchmark builds in minutes in release and its generic graph code is
//! optimised in debug builds too (it is compiled where it is instantiated).
//!
//! Two searches over one [`Vectors`] set:
//! - **flat** (exact), the reference: every vector's distance, the `k`
//!   smallest, ties broken by row order. Used below [`FLAT_BELOW`] vectors,
//!   where it is fast enough and an index would not pay for its build.
//! - **HNSW** (approximate) from the `hnsw_rs` crate, for larger sets. Its
//!   candidates (`ef` of them, more than `k`) are re-ranked by the exact
//!   distance, so every distance returned is exact and only membership is
//!   approximate.
//!
//! Why `hnsw_rs`: of the registry's ANN crates it is pure Rust and maintained
//! (0.3.x releases), inserts in parallel over rayon (the build is the cost on
//! a 2-core machine) and takes our own distance. `usearch` needs a C++
//! build; `instant-distance` has had no release since 2023; `arroy` stores
//! its trees in LMDB (a C library and files on disk).
//!
//! The distance is computed as `cosine_distance(u, v)` computes it (f64, the
//! sums in component order: `1 − u·v / (|u| |v|)`), so a flat search orders
//! rows exactly as `ORDER BY cosine_distance(col, query)` does. Vectors are
//! held as f32 (what `ai_embed` returns); the graph holds them normalised
//! and compares them with an f32 dot product, which is only used to find
//! candidates.

#[doc(hidden)]
pub mod sample;
#[cfg(test)]
mod tests;

use hnsw_rs::prelude::{Distance, Hnsw};

/// Why a vector cannot be searched or searched for.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VectorError {
    /// Its length is not the search's.
    #[error("the vector has {got} components, the search {want}")]
    Length {
        /// Its components.
        got: usize,
        /// The search's.
        want: usize,
    },
    /// A component is NaN or infinite.
    #[error("a component is not a finite number")]
    NotFinite,
    /// All components are zero: no direction, no cosine.
    #[error("the cosine of a zero vector is undefined")]
    Zero,
}

/// Below this many vectors a search is flat (exact); at or above it an HNSW
/// graph is built.
pub const FLAT_BELOW: usize = 10_000;

/// The vectors of one column, in row order, NULL rows left out.
#[derive(Debug, Clone, Default)]
pub struct Vectors {
    dims: usize,
    /// `len × dims` components, one vector after another.
    data: Vec<f32>,
    /// The table row of each vector (rows with a NULL vector have none).
    rows: Vec<u64>,
    /// Each vector's norm, as `cosine_distance` computes it.
    norms: Vec<f64>,
}

impl Vectors {
    /// An empty set of `dims`-component vectors.
    pub fn new(dims: usize) -> Self {
        Self {
            dims,
            ..Self::default()
        }
    }

    /// Adds table row `row`'s vector; an error (naming nothing: the caller
    /// names the row) for a wrong length, a non-finite component or a zero
    /// vector, whose cosine is undefined.
    pub fn push(&mut self, row: u64, v: &[f32]) -> Result<(), VectorError> {
        let norm = check_vector(v, self.dims)?;
        self.data.extend_from_slice(v);
        self.rows.push(row);
        self.norms.push(norm);
        Ok(())
    }

    /// Components per vector.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// How many vectors.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Vector `i` (in insertion order).
    pub fn get(&self, i: usize) -> &[f32] {
        &self.data[i * self.dims..(i + 1) * self.dims]
    }

    /// The table row of vector `i`.
    pub fn row(&self, i: usize) -> u64 {
        self.rows[i]
    }

    /// A 128-bit hash of the set (dims, rows and components): equal sets,
    /// equal hashes, so a built graph can be reused while it matches.
    pub fn fingerprint(&self) -> u128 {
        let mut h = twox_hash::XxHash3_128::with_seed(0);
        h.write(&(self.dims as u64).to_le_bytes());
        for row in &self.rows {
            h.write(&row.to_le_bytes());
        }
        for x in &self.data {
            h.write(&x.to_bits().to_le_bytes());
        }
        h.finish_128()
    }

    /// The exact cosine distance of vector `i` to `query`.
    pub fn distance(&self, i: usize, query: &Query) -> f64 {
        let dot: f64 = self
            .get(i)
            .iter()
            .zip(&query.values)
            .map(|(&x, &y)| f64::from(x) * y)
            .sum();
        1.0 - dot / (self.norms[i] * query.norm)
    }
}

/// The norm of `v` (sequential f64 sum, as `cosine_distance`), or why it
/// cannot be searched.
fn check_vector(v: &[f32], dims: usize) -> Result<f64, VectorError> {
    if v.len() != dims {
        return Err(VectorError::Length {
            got: v.len(),
            want: dims,
        });
    }
    if v.iter().any(|x| !x.is_finite()) {
        return Err(VectorError::NotFinite);
    }
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm == 0.0 {
        return Err(VectorError::Zero);
    }
    Ok(norm)
}

/// A query vector, checked, with its norm.
#[derive(Debug, Clone)]
pub struct Query {
    values: Vec<f64>,
    unit: Vec<f32>,
    norm: f64,
}

impl Query {
    /// `v` as a query over `dims`-component vectors, or why it cannot be one.
    pub fn new(v: &[f32], dims: usize) -> Result<Self, VectorError> {
        let norm = check_vector(v, dims)?;
        Ok(Self {
            values: v.iter().map(|&x| f64::from(x)).collect(),
            unit: v.iter().map(|&x| (f64::from(x) / norm) as f32).collect(),
            norm,
        })
    }

    /// Its components.
    pub fn dims(&self) -> usize {
        self.values.len()
    }
}

/// One search result: the table row and its exact cosine distance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    /// The table row (0-based, in scan order).
    pub row: u64,
    /// `cosine_distance(vector, query)`.
    pub distance: f64,
}

/// The `k` hits of `candidates` (vector positions) nearest `query`, nearest
/// first, ties in row order.
fn nearest(vectors: &Vectors, query: &Query, candidates: &[usize], k: usize) -> Vec<Hit> {
    let mut hits: Vec<Hit> = candidates
        .iter()
        .map(|&i| Hit {
            row: vectors.row(i),
            distance: vectors.distance(i, query),
        })
        .collect();
    // Total order: a distance is never NaN (finite, non-zero vectors), and
    // total_cmp keeps the order defined even so.
    let order = |a: &Hit, b: &Hit| a.distance.total_cmp(&b.distance).then(a.row.cmp(&b.row));
    if hits.len() > k {
        hits.select_nth_unstable_by(k, order);
        hits.truncate(k);
    }
    hits.sort_unstable_by(order);
    hits
}

/// The exact `k` nearest vectors: every distance computed.
pub fn flat_search(vectors: &Vectors, query: &Query, k: usize) -> Vec<Hit> {
    let all: Vec<usize> = (0..vectors.len()).collect();
    nearest(vectors, query, &all, k)
}

/// 1 − a·b over unit vectors, in f32 with eight running sums (so that the
/// compiler vectorises it): the graph's distance, which only ranks
/// candidates. `hnsw_rs`'s `DistDot` asserts on rounding past 1.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnitDot;

impl Distance<f32> for UnitDot {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        let mut sums = [0f32; 8];
        let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for j in 0..8 {
                sums[j] += x[j] * y[j];
            }
        }
        let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
        (1.0 - (sums.iter().sum::<f32>() + tail)).max(0.0)
    }
}

/// How an HNSW graph is built and searched.
#[derive(Debug, Clone, Copy)]
pub struct HnswParams {
    /// Links per node and layer (hnsw_rs's `max_nb_connection`, at most 256).
    pub m: usize,
    /// Candidates kept while inserting.
    pub ef_construction: usize,
    /// Candidates kept while searching (at least `k`): more is slower and
    /// finds more of the true neighbours.
    pub ef_search: usize,
}

impl Default for HnswParams {
    /// Chosen on seeded random vectors (the hardest case: clustered data
    /// and real embeddings are easier), measured in release on 2 cores:
    /// at 20k x 64, (24, 100, 200) gave recall@10 0.975-0.99 where
    /// (16, 100, 64) gave 0.78 and (24, 200, 128) 0.98 at twice the build
    /// time; at 20k x 1024, ef_search 200 gave 0.60, 800 gave 0.96 and
    /// 2000 0.999 (clustered: 1.0 from ef 100). A wide search buys recall
    /// more cheaply than a slow build, and SQL cannot tune it per query, so
    /// the default is the one that holds on the worst case.
    /// See `vector/benches/vector_search.rs`.
    fn default() -> Self {
        Self {
            m: 24,
            ef_construction: 100,
            ef_search: 800,
        }
    }
}

/// A searchable set: flat below [`FLAT_BELOW`] vectors (or when asked),
/// HNSW otherwise.
pub struct VectorIndex {
    vectors: Vectors,
    graph: Option<Hnsw<'static, f32, UnitDot>>,
    params: HnswParams,
}

impl std::fmt::Debug for VectorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VectorIndex")
            .field("vectors", &self.vectors.len())
            .field("dims", &self.vectors.dims)
            .field("approximate", &self.graph.is_some())
            .field("params", &self.params)
            .finish()
    }
}

impl VectorIndex {
    /// An index over `vectors`: a graph when there are [`FLAT_BELOW`] or more.
    pub fn build(vectors: Vectors, params: HnswParams) -> Self {
        if vectors.len() < FLAT_BELOW {
            Self::flat(vectors)
        } else {
            Self::hnsw(vectors, params)
        }
    }

    /// An exact index (no graph), whatever the size.
    pub fn flat(vectors: Vectors) -> Self {
        Self {
            vectors,
            graph: None,
            params: HnswParams::default(),
        }
    }

    /// An HNSW index, whatever the size (all vectors inserted in parallel).
    pub fn hnsw(vectors: Vectors, params: HnswParams) -> Self {
        let n = vectors.len();
        // hnsw_rs exits the process above 256 links: clamp, never pass more.
        let m = params.m.clamp(2, 256);
        let graph = Hnsw::new(m, n.max(1), 16, params.ef_construction.max(m), UnitDot);
        let units: Vec<Vec<f32>> = (0..n)
            .map(|i| {
                let inv = 1.0 / vectors.norms[i];
                vectors
                    .get(i)
                    .iter()
                    .map(|&x| (f64::from(x) * inv) as f32)
                    .collect()
            })
            .collect();
        let with_ids: Vec<(&[f32], usize)> = units
            .iter()
            .enumerate()
            .map(|(i, u)| (u.as_slice(), i))
            .collect();
        graph.parallel_insert_slice(&with_ids);
        let mut graph = graph;
        graph.set_searching_mode(true);
        Self {
            vectors,
            graph: Some(graph),
            params: HnswParams { m, ..params },
        }
    }

    /// The vectors searched.
    pub fn vectors(&self) -> &Vectors {
        &self.vectors
    }

    /// Whether searches are approximate (a graph was built).
    pub fn is_approximate(&self) -> bool {
        self.graph.is_some()
    }

    /// The `k` nearest vectors to `query`, nearest first, with exact
    /// distances: all of them when `k` ≥ the set's size (then exact, with
    /// or without a graph).
    pub fn search(&self, query: &Query, k: usize) -> Vec<Hit> {
        self.search_with_ef(query, k, self.params.ef_search)
    }

    /// [`Self::search`] keeping `ef` candidates (at least `k`) instead of
    /// the index's `ef_search`: recall against speed, per query.
    pub fn search_with_ef(&self, query: &Query, k: usize, ef: usize) -> Vec<Hit> {
        match &self.graph {
            Some(graph) if k < self.vectors.len() => {
                let ef = ef.max(k);
                let candidates: Vec<usize> = graph
                    .search(&query.unit, ef, ef)
                    .iter()
                    .map(|n| n.d_id)
                    .filter(|&i| i < self.vectors.len())
                    .collect();
                nearest(&self.vectors, query, &candidates, k)
            }
            _ => flat_search(&self.vectors, query, k),
        }
    }
}

/// The share of `exact`'s rows that `found` holds (recall@k).
pub fn recall(found: &[Hit], exact: &[Hit]) -> f64 {
    if exact.is_empty() {
        return 1.0;
    }
    let rows: std::collections::HashSet<u64> = found.iter().map(|h| h.row).collect();
    exact.iter().filter(|h| rows.contains(&h.row)).count() as f64 / exact.len() as f64
}
