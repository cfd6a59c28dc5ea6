//! Per-row random streams.
//!
//! Every generated row owns a stream keyed by `(DATA_SEED, stream name, row index)`:
//! a ChaCha8 generator seeded from the SHA-256 of that key expands the seed into the
//! state of a small xoshiro256++ generator that does the per-word draws (cheap even in
//! an unoptimised build). Row `i` is therefore the same at every scale factor and
//! independent of thread order.

use rand::RngCore;
use rand::SeedableRng;
use sha2::{Digest, Sha256};

/// The benchmark's data seed (SPEC §C).
pub const DATA_SEED: u64 = 20260818;

/// A small, fast generator (xoshiro256++).
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// The stream of row `index` of `stream` (e.g. `"reviews"`, `"reports.struct"`).
    pub fn row(stream: &str, index: u64) -> Self {
        let mut h = Sha256::new();
        h.update(DATA_SEED.to_le_bytes());
        h.update([0]);
        h.update(stream.as_bytes());
        h.update([0]);
        h.update(index.to_le_bytes());
        let seed: [u8; 32] = h.finalize().into();
        let mut chacha = rand_chacha::ChaCha8Rng::from_seed(seed);
        let mut s = [0u64; 4];
        for x in &mut s {
            *x = chacha.next_u64();
        }
        if s == [0; 4] {
            s[0] = 1;
        }
        Self { s }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = (s[0].wrapping_add(s[3])).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, n) (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        debug_assert!(n > 0);
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }

    /// Uniform in [lo, hi] (inclusive).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.f64() < p
    }

    /// One element of a non-empty slice.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }

    /// One element of a non-empty slice (owned items).
    pub fn pick_ref<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    /// Index drawn with the given weights (not all zero).
    pub fn weighted(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        let mut x = self.f64() * total;
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len() - 1
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.f64().max(1e-300);
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Log-normal with the given median and sigma, clipped to [lo, hi].
    pub fn lognormal(&mut self, median: f64, sigma: f64, lo: f64, hi: f64) -> f64 {
        (median * (sigma * self.normal()).exp()).clamp(lo, hi)
    }

    /// Index in [0, n) with probability roughly proportional to 1/(k+1) (log-uniform).
    pub fn zipf(&mut self, n: usize) -> usize {
        let k = ((n as f64 + 1.0).ln() * self.f64()).exp() as usize;
        k.saturating_sub(1).min(n - 1)
    }

    /// `k` distinct indices of [0, n), in increasing order (k ≤ n).
    pub fn sample_distinct(&mut self, n: usize, k: usize) -> Vec<usize> {
        let k = k.min(n);
        let mut out: Vec<usize> = Vec::with_capacity(k);
        if k * 3 > n {
            let mut all: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = i + self.below(n - i);
                all.swap(i, j);
            }
            out.extend_from_slice(&all[..k]);
        } else {
            let mut seen = std::collections::HashSet::with_capacity(k);
            while out.len() < k {
                let x = self.below(n);
                if seen.insert(x) {
                    out.push(x);
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// Shuffles a slice in place.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i + 1);
            xs.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_keyed_and_repeatable() {
        let a: Vec<u64> = (0..4).map(|_| Rng::row("reviews", 7).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            Rng::row("reviews", 7).next_u64(),
            Rng::row("reviews", 8).next_u64()
        );
        assert_ne!(
            Rng::row("reviews", 7).next_u64(),
            Rng::row("reports", 7).next_u64()
        );
        let mut r = Rng::row("x", 0);
        let m: f64 = (0..20000)
            .map(|_| r.lognormal(221.0, 0.78, 1.0, 1e9))
            .sum::<f64>()
            / 20000.0;
        assert!((m - 300.0).abs() < 20.0, "{m}");
        let d = r.sample_distinct(10, 4);
        assert_eq!(d.len(), 4);
        assert!(d.windows(2).all(|w| w[0] < w[1]));
    }
}
