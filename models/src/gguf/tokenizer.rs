//! The tokenizer a GGUF file carries in its `tokenizer.ggml.*` metadata, as a
//! Hugging Face `tokenizer.json`, and back.
//!
//! GGUF keeps the vocabulary, each token's type and the BPE merges, and names the
//! pre-tokenizer (`tokenizer.ggml.pre`). The pipeline around them (NFC, Qwen2's split
//! pattern, byte-level) is Qwen's, taken from the vendored `tokenizer.json`; only
//! `qwen2` pre-tokenization (every Qwen2 and Qwen3 GGUF) is accepted.

use candle_core::quantized::gguf_file::Value;
use serde_json::json;

use super::GgufFile;
use crate::tokenizer::{Tokenizer, vendored_tokenizer_json};
use crate::{ModelError, Result};

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The tokenizer of `file`, built from its metadata.
pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
    let bad = |m: String| ModelError::Gguf {
        path: file.path().to_path_buf(),
        message: m,
    };
    match file.str_key("tokenizer.ggml.model")? {
        Some("gpt2") => {}
        other => {
            return Err(bad(format!(
                "tokenizer.ggml.model is {other:?}; aisql reads byte-level BPE (\"gpt2\") tokenizers"
            )));
        }
    }
    match file.str_key("tokenizer.ggml.pre")? {
        Some("qwen2") => {}
        other => {
            return Err(bad(format!(
                "tokenizer.ggml.pre is {other:?}; aisql reads Qwen's (\"qwen2\") pre-tokenizer"
            )));
        }
    }
    let strings = |key: &str| -> Result<Vec<&str>> {
        match file.metadata(key) {
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.as_str()),
                    v => Err(bad(format!("{key}[{i}] is {v:?}, not a string"))),
                })
                .collect(),
            Some(v) => Err(bad(format!("{key} is {:?}, not an array", v.value_type()))),
            None => Err(bad(format!("metadata key {key} is missing"))),
        }
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?;
    let types: Vec<i32> = match file.metadata("tokenizer.ggml.token_type") {
        None => vec![NORMAL; tokens.len()],
        Some(Value::Array(items)) if items.len() == tokens.len() => items
            .iter()
            .map(|v| match v {
                Value::I32(t) => Ok(*t),
                v => Err(bad(format!("tokenizer.ggml.token_type holds {v:?}"))),
            })
            .collect::<Result<_>>()?,
        Some(_) => {
            return Err(bad(format!(
                "tokenizer.ggml.token_type is not an array of {} token types",
                tokens.len()
            )));
        }
    };
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (&token, &kind)) in tokens.iter().zip(&types).enumerate() {
        match kind {
            CONTROL | USER_DEFINED => added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": kind == CONTROL,
            })),
            UNUSED => {}
            _ => {
                vocab.insert(token.to_string(), json!(id));
            }
        }
    }
    let merges: Vec<serde_json::Value> = merges
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) => Ok(json!([a, b])),
            None => Err(bad(format!(
                "tokenizer.ggml.merges[{i}] {m:?} is not \"A B\""
            ))),
        })
        .collect::<Result<_>>()?;
    let mut doc: serde_json::Value = serde_json::from_slice(&vendored_tokenizer_json()?)
        .map_err(|e| ModelError::Tokenizer(format!("vendored tokenizer: {e}")))?;
    doc["added_tokens"] = serde_json::Value::Array(added);
    doc["model"]["vocab"] = serde_json::Value::Object(vocab);
    doc["model"]["merges"] = serde_json::Value::Array(merges);
    let bytes = serde_json::to_vec(&doc).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    Tokenizer::from_json(&bytes).map_err(|e| bad(format!("its tokenizer metadata: {e}")))
}

/// The `tokenizer.ggml.*` metadata of a Hugging Face `tokenizer.json` (Qwen's
/// byte-level BPE), with the token list padded to `vocab_size` rows as llama.cpp's
/// converter pads it.
pub(crate) fn metadata(tokenizer_json: &[u8], vocab_size: usize) -> Result<Vec<(String, Value)>> {
    let bad = |m: String| ModelError::Tokenizer(format!("tokenizer.json: {m}"));
    let doc: serde_json::Value =
        serde_json::from_slice(tokenizer_json).map_err(|e| bad(e.to_string()))?;
    if doc["model"]["type"] != "BPE" {
        return Err(bad("the model is not BPE".into()));
    }
    let mut tokens: Vec<Option<(String, i32)>> = vec![None; vocab_size];
    let mut place = |id: u64, text: &str, kind: i32| -> Result<()> {
        let slot = tokens.get_mut(id as usize).ok_or_else(|| {
            bad(format!(
                "token {text:?} has id {id}, past the vocabulary of {vocab_size}"
            ))
        })?;
        *slot = Some((text.to_string(), kind));
        Ok(())
    };
    let vocab = doc["model"]["vocab"]
        .as_object()
        .ok_or_else(|| bad("model.vocab is not an object".into()))?;
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| bad(format!("token {text:?} has no id")))?;
        place(id, text, NORMAL)?;
    }
    for t in doc["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(text)) = (t["id"].as_u64(), t["content"].as_str()) else {
            return Err(bad(format!("added token {t} lacks id or content")));
        };
        let kind = if t["special"].as_bool() == Some(true) {
            CONTROL
        } else {
            USER_DEFINED
        };
        place(id, text, kind)?;
    }
    let (texts, kinds): (Vec<Value>, Vec<Value>) = tokens
        .into_iter()
        .enumerate()
        .map(|(id, t)| match t {
            Some((text, kind)) => (Value::String(text), Value::I32(kind)),
            None => (Value::String(format!("[PAD{id}]")), Value::I32(UNUSED)),
        })
        .unzip();
    let merges = doc["model"]["merges"]
        .as_array()
        .ok_or_else(|| bad("model.merges is not an array".into()))?
        .iter()
        .map(|m| match (m.as_str(), m.as_array()) {
            (Some(s), _) => Ok(Value::String(s.to_string())),
            (_, Some(pair)) if pair.len() == 2 => Ok(Value::String(format!(
                "{} {}",
                pair[0].as_str().unwrap_or_default(),
                pair[1].as_str().unwrap_or_default()
            ))),
            _ => Err(bad(format!("merge {m} is neither \"A B\" nor [A, B]"))),
        })
        .collect::<Result<Vec<_>>>()?;
    let id_of = |text: &str| -> Option<Value> {
        doc["added_tokens"]
            .as_array()?
            .iter()
            .find(|t| t["content"] == text)
            .and_then(|t| t["id"].as_u64())
            .map(|id| Value::U32(id as u32))
    };
    let mut out = vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".to_string(),
            Value::String("qwen2".into()),
        ),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(texts)),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(kinds)),
        ("tokenizer.ggml.merges".to_string(), Value::Array(merges)),
        (
            "tokenizer.ggml.add_bos_token".to_string(),
            Value::Bool(false),
        ),
    ];
    for (key, text) in [
        ("tokenizer.ggml.eos_token_id", "<|im_end|>"),
        ("tokenizer.ggml.padding_token_id", "<|endoftext|>"),
        ("tokenizer.ggml.bos_token_id", "<|endoftext|>"),
    ] {
        if let Some(id) = id_of(text) {
            out.push((key.to_string(), id));
        }
    }
    Ok(out)
}
