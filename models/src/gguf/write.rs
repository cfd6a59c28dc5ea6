//! Writing a safetensors Qwen3 as a GGUF file llama.cpp loads: its shape and
//! tokenizer as metadata, its tensors in the file type asked for, each 2-D weight
//! typed as llama.cpp's own quantizer types it (norms stay f32).

use std::path::Path;
use std::str::FromStr;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device};

use crate::precision::block_format_for;
use crate::qwen3::Config;
use crate::source::{ModelFiles, Weights};
use crate::tokenizer::vendored_tokenizer_json;
use crate::{ModelError, Result};

/// A GGUF file type, as llama.cpp's `llama-quantize` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    /// Every weight f32.
    F32,
    /// 2-D weights f16.
    F16,
    /// 2-D weights Q8_0.
    Q8_0,
    /// Q4_K, with Q6_K for the output head, and for `attn_v` and `ffn_down` in the
    /// first and last eighth of the layers and every third layer between.
    Q4KM,
}

impl FileType {
    /// Every accepted spelling, for messages.
    pub const CHOICES: &'static str = "f32, f16, q8_0 or q4_k_m";

    /// llama.cpp's `general.file_type` number (`enum llama_ftype`).
    fn number(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q8_0 => 7,
            Self::Q4KM => 15,
        }
    }

    /// The block format of the 2-D weight `gguf_name` in layer `layer` of `layers`.
    fn weight_type(self, gguf_name: &str, layer: Option<usize>, layers: usize) -> GgmlDType {
        // llama.cpp's `use_more_bits`: these layers' attn_v and ffn_down get Q6_K.
        let more_bits =
            |i: usize| i < layers / 8 || i >= 7 * layers / 8 || (i - layers / 8) % 3 == 2;
        match self {
            Self::F32 => GgmlDType::F32,
            Self::F16 => GgmlDType::F16,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q4KM => {
                let head = gguf_name == "output.weight";
                let boosted = layer.is_some_and(more_bits)
                    && (gguf_name.ends_with("attn_v.weight")
                        || gguf_name.ends_with("ffn_down.weight"));
                if head || boosted {
                    GgmlDType::Q6K
                } else {
                    GgmlDType::Q4K
                }
            }
        }
    }
}

impl FromStr for FileType {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" => Self::F32,
            "f16" => Self::F16,
            "q8_0" => Self::Q8_0,
            "q4_k_m" => Self::Q4KM,
            _ => {
                return Err(ModelError::Unsupported(format!(
                    "GGUF file type {s:?} (use {})",
                    Self::CHOICES
                )));
            }
        })
    }
}

/// What [`write_gguf`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of the file.
    pub bytes: u64,
}

/// Writes the safetensors model `files` to `out` as a GGUF of `file_type`. `out` must
/// not exist; the file appears complete or not at all (written beside it, then renamed).
pub fn write_gguf(files: &ModelFiles, out: &Path, file_type: FileType) -> Result<Written> {
    let Some(config_path) = &files.config else {
        return Err(ModelError::Unsupported(
            "the model is a GGUF file already; write from a safetensors model".into(),
        ));
    };
    if out.exists() {
        return Err(ModelError::InvalidInput(format!(
            "{} exists; aisql does not write over a file (remove it or choose another path)",
            out.display()
        )));
    }
    let cfg = Config::from_file(config_path)?;
    let weights = Weights::open(&files.weights)?;
    let tokenizer_json = match &files.tokenizer {
        Some(p) => std::fs::read(p).map_err(|e| ModelError::io(p, e))?,
        None => vendored_tokenizer_json()?,
    };
    let mut metadata = config_metadata(&cfg, file_type);
    metadata.extend(super::tokenizer::metadata(&tokenizer_json, cfg.vocab_size)?);

    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for (hf, shape) in cfg.weight_shapes() {
        let layer = hf
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split('.').next()?.parse::<usize>().ok());
        let gguf = super::gguf_name(&hf).expect("every Qwen3 tensor has a GGUF name");
        let t = weights.get(&hf, &shape, DType::F32, &Device::Cpu)?;
        let tied_head = hf == "model.embed_tokens.weight" && cfg.tie_word_embeddings;
        let kind = match shape.len() {
            1 => GgmlDType::F32,
            _ => {
                let name = if tied_head {
                    "output.weight"
                } else {
                    gguf.as_str()
                };
                let wanted = file_type.weight_type(name, layer, cfg.num_hidden_layers);
                block_format_for(wanted, shape[1]).unwrap_or(GgmlDType::F16)
            }
        };
        tensors.push((gguf, QTensor::quantize(&t, kind)?));
    }

    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = parent.join(format!(
        ".{}.{}.partial",
        out.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("model.gguf"),
        std::process::id()
    ));
    let result = (|| -> Result<u64> {
        let file = std::fs::File::create(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
        let mut w = std::io::BufWriter::new(file);
        let meta: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        candle_core::quantized::gguf_file::write(&mut w, &meta, &ts)?;
        let file = w
            .into_inner()
            .map_err(|e| ModelError::io(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| ModelError::io(&tmp, e))?;
        let bytes = file.metadata().map_err(|e| ModelError::io(&tmp, e))?.len();
        // Refuse to replace a file that appeared meanwhile.
        if out.exists() {
            return Err(ModelError::InvalidInput(format!(
                "{} appeared while writing; not replaced",
                out.display()
            )));
        }
        std::fs::rename(&tmp, out).map_err(|e| ModelError::io(out, e))?;
        Ok(bytes)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(Written {
        tensors: tensors.len(),
        bytes: result?,
    })
}

/// The `general.*` and `qwen3.*` metadata of a model of shape `cfg`.
fn config_metadata(cfg: &Config, file_type: FileType) -> Vec<(String, Value)> {
    let u = |n: usize| Value::U32(n as u32);
    vec![
        ("general.architecture".into(), Value::String("qwen3".into())),
        ("general.name".into(), Value::String("aisql export".into())),
        ("general.file_type".into(), Value::U32(file_type.number())),
        ("general.quantization_version".into(), Value::U32(2)),
        ("qwen3.block_count".into(), u(cfg.num_hidden_layers)),
        (
            "qwen3.context_length".into(),
            u(cfg.max_position_embeddings),
        ),
        ("qwen3.embedding_length".into(), u(cfg.hidden_size)),
        ("qwen3.feed_forward_length".into(), u(cfg.intermediate_size)),
        (
            "qwen3.attention.head_count".into(),
            u(cfg.num_attention_heads),
        ),
        (
            "qwen3.attention.head_count_kv".into(),
            u(cfg.num_key_value_heads),
        ),
        ("qwen3.attention.key_length".into(), u(cfg.head_dim)),
        ("qwen3.attention.value_length".into(), u(cfg.head_dim)),
        (
            "qwen3.rope.freq_base".into(),
            Value::F32(cfg.rope_theta as f32),
        ),
        (
            "qwen3.attention.layer_norm_rms_epsilon".into(),
            Value::F32(cfg.rms_norm_eps as f32),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_gives_more_bits_where_llama_cpp_does() {
        let t = |name: &str, l: Option<usize>| FileType::Q4KM.weight_type(name, l, 28);
        assert_eq!(t("output.weight", None), GgmlDType::Q6K);
        assert_eq!(t("blk.0.attn_v.weight", Some(0)), GgmlDType::Q6K);
        assert_eq!(t("blk.5.ffn_down.weight", Some(5)), GgmlDType::Q6K);
        assert_eq!(t("blk.4.ffn_down.weight", Some(4)), GgmlDType::Q4K);
        assert_eq!(t("blk.27.attn_v.weight", Some(27)), GgmlDType::Q6K);
        assert_eq!(t("blk.5.attn_q.weight", Some(5)), GgmlDType::Q4K);
        assert!("q3_k_s".parse::<FileType>().is_err());
    }
}
