//! Test fixtures: model directories written once per test binary, and a reference
//! full forward through candle-transformers' own `qwen3` on the same files.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use candle_core::{D, DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::qwen3 as ct;

use crate::qwen3::Config;
use crate::tiny;

/// The tiny model (seed 7), written once.
pub(crate) fn tiny_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        tiny::write_tiny_model(dir.path(), 7).unwrap();
        dir
    })
    .path()
}

/// A bigger random config: GQA 8:2, head_dim 32 ≠ hidden/heads, 3 layers, untied head.
pub(crate) fn big_config() -> Config {
    Config {
        vocab_size: 1000,
        hidden_size: 128,
        intermediate_size: 320,
        num_hidden_layers: 3,
        num_attention_heads: 8,
        num_key_value_heads: 2,
        head_dim: 32,
        rope_theta: 10_000.0,
        tie_word_embeddings: false,
        ..tiny::tiny_config()
    }
}

/// The bigger model (seed 11), written once.
pub(crate) fn big_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        tiny::write_model(dir.path(), &big_config(), 11).unwrap();
        dir
    })
    .path()
}

/// candle-transformers' Qwen3 loaded from `dir`, plus its output-head matrix.
pub(crate) struct Reference {
    model: ct::Model,
    head: Tensor,
}

impl Reference {
    pub(crate) fn load(dir: &Path) -> Self {
        let cfg: ct::Config =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let files: Vec<PathBuf> = vec![dir.join("model.safetensors")];
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &Device::Cpu) }
            .unwrap();
        let model = ct::Model::new(&cfg, vb.clone()).unwrap();
        let name = if cfg.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let head = vb.get((cfg.vocab_size, cfg.hidden_size), name).unwrap();
        Self { model, head }
    }

    /// Logits `(len, vocab)` of one whole prompt in a single forward from position 0.
    pub(crate) fn logits(&self, tokens: &[u32]) -> Tensor {
        // A fresh clone: the reference keeps its KV inside the model.
        let mut m = self.model.clone();
        let input = Tensor::new(tokens, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        m.forward(&input, 0)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .matmul(&self.head.t().unwrap())
            .unwrap()
    }

    /// Logits `(vocab,)` after the last token of `tokens`, one forward from position
    /// 0 with no cache: the next-token distribution of plain greedy decoding.
    pub(crate) fn next_logits(&self, tokens: &[u32]) -> Vec<f32> {
        let mut m = self.model.clone();
        let input = Tensor::new(tokens, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let hidden = m.forward(&input, 0).unwrap().squeeze(0).unwrap();
        hidden
            .get(tokens.len() - 1)
            .unwrap()
            .unsqueeze(0)
            .unwrap()
            .matmul(&self.head.t().unwrap())
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// Sum of log-probs of `label` teacher-forced after `prompt`.
    pub(crate) fn label_logprob(&self, prompt: &[u32], label: &[u32]) -> f32 {
        let all: Vec<u32> = prompt.iter().chain(label).copied().collect();
        let lsm = candle_nn::ops::log_softmax(&self.logits(&all), D::Minus1).unwrap();
        label
            .iter()
            .enumerate()
            .map(|(j, &t)| {
                lsm.get(prompt.len() - 1 + j)
                    .unwrap()
                    .get(t as usize)
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap()
            })
            .sum()
    }
}

/// Deterministic pseudo-random token ids below `vocab`.
pub(crate) fn tokens(n: usize, seed: u64, vocab: u32) -> Vec<u32> {
    let mut x = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

/// Max |a - b| over two f32 tensors of equal shape.
pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}
