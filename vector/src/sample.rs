//! Seeded vector sets for the index's tests and benchmark: uniform random
//! directions and Gaussian clusters, from a splitmix64 stream, so that a run
//! is repeatable without a random-number crate.

/// A splitmix64 stream.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit(); // (0, 1]: no log of zero
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// `n` vectors of `dims` independent standard normal components (uniform
/// directions: the hardest case for a graph index), flattened.
pub fn random(seed: u64, n: usize, dims: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n * dims).map(|_| rng.normal() as f32).collect()
}

/// `n` vectors around `clusters` random centres (unit-variance components,
/// drawn from `centres_seed`), each `spread` per component away from its
/// centre (drawn from `points_seed`: a query set shares the centres and not
/// the points), flattened.
pub fn clustered(
    centres_seed: u64,
    points_seed: u64,
    n: usize,
    dims: usize,
    clusters: usize,
    spread: f64,
) -> Vec<f32> {
    let clusters = clusters.max(1);
    let mut rng = Rng::new(centres_seed);
    let centres: Vec<f64> = (0..clusters * dims).map(|_| rng.normal()).collect();
    let mut rng = Rng::new(points_seed);
    let mut out = Vec::with_capacity(n * dims);
    for _ in 0..n {
        let c = (rng.next_u64() % clusters as u64) as usize;
        for d in 0..dims {
            out.push((centres[c * dims + d] + spread * rng.normal()) as f32);
        }
    }
    out
}
