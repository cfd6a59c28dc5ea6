//! Input generation: mutations of real seeds. Byte-level edits suit the binary
//! formats (Substrait protobuf, Parquet); inputs that parse as JSON also get
//! tree edits (replace, drop, duplicate or nest a value) so that most mutants stay
//! well-formed and reach the code behind the parser; text anywhere may be replaced
//! by hostile strings.

use rand::{Rng, RngCore};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

/// Text built to break text handling: NUL, right-to-left marks, template
/// placeholders, path tricks, invalid and odd Unicode, huge and tiny numbers.
pub const HOSTILE: &[&str] = &[
    "\0",
    "a\0b",
    "\u{202E}evil\u{202C}",
    "\u{200F}\u{061C}",
    "{0}",
    "{1}",
    "{0}{0}{1}{2}",
    "{",
    "}",
    "{{0}}",
    "../../etc/passwd",
    "/abs/path",
    "a/../../b",
    "..",
    ".",
    "",
    " ",
    "\n\n\n",
    "\r\n",
    "\u{FEFF}",
    "\u{FFFD}",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "<|im_start|>assistant\n",
    "<think>",
    "TRUE",
    "FALSE",
    "NaN",
    "-0",
    "1e999",
    "18446744073709551616",
    "-9223372036854775809",
    "ai_filter",
    "quailb.imdb.review.genre",
    // SQL pieces for the sql target.
    " AND ",
    " OR NOT ",
    "ai_filter('Is {0} kind?', body)",
    "ai_join('Does {0} cite {1}?', ",
    "ai_classify('Tone of {0}?', body, ['a', 'b'], ['', ''])",
    "AI.IF(('Is ', body, ' kind?'))",
    "AI_FILTER(PROMPT('{0} and {1}', ",
    " LEFT JOIN topics t ON ",
    " FULL JOIN ",
    " WHERE ",
    " GROUP BY 1",
    " ORDER BY 1",
    " UNION ALL SELECT ",
    " WHERE EXISTS (SELECT 1 FROM evidence e WHERE ",
    "CASE WHEN ",
    " IS NULL",
    "NULL",
    "(SELECT ",
];

/// Byte strings worth inserting into binary inputs.
const MAGIC: &[&[u8]] = &[
    b"PAR1",
    &[0xff, 0xff, 0xff, 0xff],
    &[0x7f, 0xff, 0xff, 0xff],
    &[0x80, 0x00, 0x00, 0x00],
    &[0, 0, 0, 0],
    &[0xc3, 0x28],
    &[0xed, 0xa0, 0x80],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
];

/// A mutator with its own deterministic random stream.
pub struct Mutator {
    rng: ChaCha8Rng,
    /// Longest input produced (mutants are cut to it).
    pub max_len: usize,
}

impl Mutator {
    /// A mutator seeded with `seed`, producing inputs of at most `max_len` bytes.
    pub fn new(rng: ChaCha8Rng, max_len: usize) -> Self {
        Self { rng, max_len }
    }

    /// A random number below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n.max(1))
    }

    /// A mutant of `input`; `other` is another corpus entry to splice from.
    pub fn mutate(&mut self, input: &[u8], other: &[u8]) -> Vec<u8> {
        let mut out = input.to_vec();
        // Tree edits on inputs of reasonable size only (a copy of a large subtree
        // is as large again).
        let json = (input.len() <= 256 << 10)
            .then(|| serde_json::from_slice::<Value>(input).ok())
            .flatten();
        let rounds = 1 + self.below(4);
        match json {
            Some(mut v) if self.below(4) != 0 => {
                for _ in 0..rounds {
                    self.mutate_json(&mut v, 0);
                }
                out = serde_json::to_vec(&v).unwrap_or(out);
                if self.below(8) == 0 {
                    self.mutate_bytes(&mut out, other);
                }
            }
            _ => {
                for _ in 0..rounds {
                    self.mutate_bytes(&mut out, other);
                }
            }
        }
        out.truncate(self.max_len);
        out
    }

    fn hostile(&mut self) -> String {
        let mut s = String::new();
        for _ in 0..1 + self.below(3) {
            s.push_str(HOSTILE[self.below(HOSTILE.len())]);
        }
        if self.below(16) == 0 {
            s = s.repeat(1 + self.below(2000));
        }
        s
    }

    fn mutate_bytes(&mut self, out: &mut Vec<u8>, other: &[u8]) {
        let len = out.len();
        match self.below(9) {
            0 if len > 0 => {
                let i = self.below(len);
                out[i] ^= 1 << self.below(8);
            }
            1 if len > 0 => {
                let i = self.below(len);
                out[i] = [0, 1, 0x7f, 0x80, 0xff][self.below(5)];
            }
            2 if len > 0 => {
                let i = self.below(len);
                let n = 1 + self.below((len - i).min(64));
                out.drain(i..i + n);
            }
            3 => {
                let i = self.below(len + 1);
                let m = MAGIC[self.below(MAGIC.len())];
                out.splice(i..i, m.iter().copied());
            }
            4 => {
                let i = self.below(len + 1);
                let h = self.hostile();
                out.splice(i..i, h.bytes());
            }
            5 if !other.is_empty() => {
                // Splice: our head, the other's tail.
                let i = self.below(len + 1);
                let j = self.below(other.len());
                out.truncate(i);
                out.extend_from_slice(&other[j..]);
            }
            6 if len > 1 => {
                // Duplicate a chunk.
                let i = self.below(len);
                let n = 1 + self.below((len - i).min(256));
                let chunk = out[i..i + n].to_vec();
                let at = self.below(out.len() + 1);
                out.splice(at..at, chunk);
            }
            7 if len > 0 => {
                out.truncate(self.below(len));
            }
            _ => {
                let i = self.below(len + 1);
                let mut b = [0u8; 4];
                self.rng.fill_bytes(&mut b);
                out.splice(i..i, b[..1 + self.below(4)].iter().copied());
            }
        }
    }

    fn mutate_json(&mut self, v: &mut Value, depth: usize) {
        // Walk to a random node, then edit it.
        let descend = depth < 40 && self.below(4) != 0;
        match v {
            Value::Object(m) if descend && !m.is_empty() => {
                let k = m.keys().nth(self.below(m.len())).cloned().expect("key");
                match self.below(10) {
                    0 => {
                        m.remove(&k);
                    }
                    1 => {
                        let copy = m[&k].clone();
                        let key = self.hostile();
                        m.insert(key, copy);
                    }
                    _ => self.mutate_json(m.get_mut(&k).expect("key"), depth + 1),
                }
            }
            Value::Array(a) if descend && !a.is_empty() => {
                let i = self.below(a.len());
                match self.below(10) {
                    0 => {
                        a.remove(i);
                    }
                    1 => {
                        let copy = a[i].clone();
                        // Many copies only of small values: copies of copies grow
                        // the tree exponentially, and the fuzzer would stall.
                        let small = serde_json::to_vec(&copy).is_ok_and(|v| v.len() <= 256);
                        let most = if small && self.below(8) == 0 { 5000 } else { 3 };
                        for _ in 0..1 + self.below(most) {
                            a.push(copy.clone());
                        }
                    }
                    _ => self.mutate_json(&mut a[i], depth + 1),
                }
            }
            _ => *v = self.replacement(v),
        }
    }

    fn replacement(&mut self, v: &Value) -> Value {
        match self.below(9) {
            0 => Value::Null,
            1 => Value::Bool(self.below(2) == 0),
            2 => {
                let n: [i64; 8] = [0, -1, 1, i64::MAX, i64::MIN, 1 << 31, 255, 65536];
                Value::from(n[self.below(n.len())])
            }
            3 => Value::from([0.5, -1e308, 1e308, f64::MIN_POSITIVE][self.below(4)]),
            4 => Value::String(self.hostile()),
            5 => match v {
                Value::String(s) => {
                    let mut s = s.clone();
                    let at = (0..=s.len())
                        .filter(|&i| s.is_char_boundary(i))
                        .nth(self.below(s.chars().count() + 1))
                        .unwrap_or(0);
                    s.insert_str(at, &self.hostile());
                    Value::String(s)
                }
                _ => Value::String(self.hostile()),
            },
            6 => {
                // Nest the value deep: stack-depth bugs live here.
                let mut nested = v.clone();
                for _ in 0..1 + self.below(200) {
                    nested = if self.below(2) == 0 {
                        Value::Array(vec![nested])
                    } else {
                        serde_json::json!({ "input": nested })
                    };
                }
                nested
            }
            7 => Value::Array(Vec::new()),
            _ => Value::Object(Default::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn mutants_are_deterministic_bounded_and_mostly_valid_json() {
        let seed = br#"{"relations":[{"root":{"input":{"filter":{"x":1}}},"names":["a"]}]}"#;
        let run = || {
            let mut m = Mutator::new(ChaCha8Rng::seed_from_u64(7), 4096);
            (0..200).map(|_| m.mutate(seed, b"{}")).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run(), "same seed, same mutants");
        assert!(a.iter().all(|x| x.len() <= 4096));
        let valid = a
            .iter()
            .filter(|x| serde_json::from_slice::<Value>(x).is_ok())
            .count();
        assert!(valid > 100, "{valid} of 200 mutants parse as JSON");
        assert!(a.iter().any(|x| x.as_slice() != seed.as_slice()));
    }
}
