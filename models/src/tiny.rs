//! A deterministic tiny Qwen3 with random weights: real Qwen3 vocabulary and file
//! layout (so every loader, tokenizer and benchmark path is exercised), but small
//! enough (2 layers, hidden 64) to run tens of millions of tokens on a laptop CPU.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::qwen3::Config;
use crate::tokenizer::vendored_tokenizer_json;
use crate::{ModelError, Result};

/// Standard deviation of the embedding weights: large enough that logits spread
/// (about ±1), so decisions and label scores are not ties.
const EMBED_STD: f32 = 0.1;
/// Standard deviation of every projection weight.
const PROJ_STD: f32 = 0.08;

/// The tiny model's configuration: 2 layers, hidden 64, 4 query / 2 KV heads of 16,
/// intermediate 192, tied embeddings, Qwen3's 151936-row vocabulary.
pub fn tiny_config() -> Config {
    Config {
        vocab_size: 151_936,
        hidden_size: 64,
        intermediate_size: 192,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: true,
        attention_bias: false,
        hidden_act: candle_nn::Activation::Silu,
        use_sliding_window: false,
        rope_scaling: None,
        max_position_embeddings: 40_960,
    }
}

/// The shape of Qwen3-0.6B (28 layers, hidden 1024, 16 query / 8 KV heads of 128,
/// intermediate 3072, tied embeddings), for throughput measurements at a real size.
pub fn qwen3_0_6b_config() -> Config {
    Config {
        hidden_size: 1024,
        intermediate_size: 3072,
        num_hidden_layers: 28,
        num_attention_heads: 16,
        num_key_value_heads: 8,
        head_dim: 128,
        ..tiny_config()
    }
}

/// The `config.json` Hugging Face writes for `cfg` (all keys candle-transformers'
/// `qwen3::Config` also requires).
pub fn hf_config_json(cfg: &Config) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": cfg.attention_bias,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": cfg.intermediate_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "max_window_layers": cfg.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": cfg.num_attention_heads,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_key_value_heads": cfg.num_key_value_heads,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_scaling": null,
        "rope_theta": cfg.rope_theta,
        "sliding_window": null,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "torch_dtype": "float32",
        "transformers_version": "4.51.0",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": cfg.vocab_size,
    })
}

/// Seeded random f32 weights for `cfg`, keyed by Hugging Face tensor name. Norm
/// weights are 1, biases 0; every matrix is uniform with the stds above, drawn in
/// checkpoint order ([`Config::weight_shapes`]), so the seed alone fixes them.
pub fn random_weights(cfg: &Config, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = HashMap::new();
    for (name, shape) in cfg.weight_shapes() {
        let t = match shape.as_slice() {
            [_, _] => {
                let std = match name.as_str() {
                    "model.embed_tokens.weight" | "lm_head.weight" => EMBED_STD,
                    _ => PROJ_STD,
                };
                // Uniform on ±std·√3 has standard deviation `std`.
                let a = std * 3f32.sqrt();
                let n = shape.iter().product();
                let data: Vec<f32> = (0..n).map(|_| rng.random_range(-a..a)).collect();
                Tensor::from_vec(data, shape.as_slice(), &Device::Cpu)?
            }
            _ if name.ends_with(".bias") => {
                Tensor::zeros(shape.as_slice(), candle_core::DType::F32, &Device::Cpu)?
            }
            _ => Tensor::ones(shape.as_slice(), candle_core::DType::F32, &Device::Cpu)?,
        };
        out.insert(name, t);
    }
    Ok(out)
}

/// Writes a random Qwen3 for `cfg` into `dir` in Hugging Face layout: `config.json`,
/// `model.safetensors` (f32, `format: pt` metadata) and the vendored `tokenizer.json`.
pub fn write_model(dir: &Path, cfg: &Config, seed: u64) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let config_path = dir.join("config.json");
    let json = serde_json::to_string_pretty(&hf_config_json(cfg)).expect("a JSON value serialises");
    std::fs::write(&config_path, json + "\n").map_err(|e| ModelError::io(&config_path, e))?;
    let weights = random_weights(cfg, seed)?;
    let path = dir.join("model.safetensors");
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(
        weights.iter().map(|(k, t)| (k.as_str(), t)),
        Some(metadata),
        &path,
    )
    .map_err(|e| ModelError::SafeTensors {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let tok_path = dir.join("tokenizer.json");
    std::fs::write(&tok_path, vendored_tokenizer_json()?)
        .map_err(|e| ModelError::io(&tok_path, e))?;
    Ok(())
}

/// Writes the tiny model ([`tiny_config`]) with weights drawn from `seed` into `dir`.
/// The same seed always gives byte-identical files.
pub fn write_tiny_model(dir: &Path, seed: u64) -> Result<()> {
    write_model(dir, &tiny_config(), seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_weights_are_refused_with_the_tensor_named() {
        let d = tempfile::tempdir().unwrap();
        write_tiny_model(d.path(), 0).unwrap();
        let mut weights = random_weights(&tiny_config(), 0).unwrap();
        let name = "model.norm.weight";
        let norm = weights[name].clone();
        let mut values = norm.to_vec1::<f32>().unwrap();
        values[3] = f32::NAN;
        let poisoned = Tensor::from_vec(values, norm.shape(), norm.device()).unwrap();
        weights.insert(name.to_string(), poisoned);
        safetensors::serialize_to_file(
            weights.iter().map(|(k, t)| (k.as_str(), t)),
            None,
            &d.path().join("model.safetensors"),
        )
        .unwrap();
        let e = match crate::Qwen3::load(d.path(), &candle_core::Device::Cpu, None) {
            Ok(_) => panic!("NaN weights were loaded"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains(name) && e.contains("element 3") && e.contains("NaN"),
            "{e}"
        );
    }
    use crate::testutil::tiny_dir;

    #[test]
    fn same_seed_gives_identical_files() {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_model(dir.path(), 7).unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            assert_eq!(
                std::fs::read(dir.path().join(f)).unwrap(),
                std::fs::read(tiny_dir().join(f)).unwrap(),
                "{f}"
            );
        }
        let other = random_weights(&tiny_config(), 8).unwrap();
        let this = random_weights(&tiny_config(), 7).unwrap();
        let (a, b) = (
            &this["model.layers.1.mlp.up_proj.weight"],
            &other["model.layers.1.mlp.up_proj.weight"],
        );
        assert!(crate::testutil::max_abs_diff(a, b) > 0.0);
    }

    #[test]
    fn writes_hugging_face_layout() {
        let dir = tiny_dir();
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg["architectures"][0], "Qwen3ForCausalLM");
        assert_eq!(cfg["model_type"], "qwen3");
        assert_eq!(cfg["vocab_size"], 151_936);
        let parsed = crate::Config::from_file(dir.join("config.json")).unwrap();
        assert_eq!(parsed, tiny_config());
        let st =
            candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
        assert_eq!(st["model.embed_tokens.weight"].dims(), &[151_936, 64]);
        assert_eq!(
            st["model.layers.1.self_attn.k_proj.weight"].dims(),
            &[32, 64]
        );
        assert_eq!(st["model.layers.0.self_attn.q_norm.weight"].dims(), &[16]);
        assert!(
            !st.contains_key("lm_head.weight"),
            "tied embeddings store no head"
        );
        assert_eq!(st.len(), 1 + 2 * 11 + 1);
        let (model, tok) = crate::load(dir.to_str().unwrap(), &Device::Cpu, None).unwrap();
        assert_eq!(tok.vocab_size(), 151_669);
        assert_eq!(model.dtype(), candle_core::DType::F32);
    }
}
