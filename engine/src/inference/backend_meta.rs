//! What a built backend says about itself ([`BackendMeta`]): the model, its
//! device and dtype, its KV budgets, the simulation, the workers and the
//! answer cache. One typed struct, filled where the backend is built, read by
//! field (estimates, `aisql worker`'s banner, calibration), sent to a
//! coordinator in the worker's hello and recorded in run.json's metadata.
//!
//! Every field is optional: a backend records only what it has (the plain
//! oracle nothing, a simulation no model or device). The serialized form
//! omits absent fields and keeps the field order below, which is the order
//! run.json has always listed them in (serde_json keeps insertion order here).

use serde::{Deserialize, Serialize};

/// A backend's description of itself, for run records and estimates.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendMeta {
    /// `--cuda-kernels` as the GPU model runs it (`auto`, `all`, `off`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_kernels: Option<String>,
    /// Device memory left free by the weights, from which the KV budget was
    /// sized (a GPU without `--kv-budget-mb`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_free_bytes_after_weights: Option<usize>,
    /// The model as the user named it (`tiny`, a folder, a Hugging Face id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Where the model was read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_path: Option<String>,
    /// `cpu` or `cuda:N` (the first worker's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The weights' format as loaded (`f32`, `bf16`, `q8_0`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// `true` when the scheduler runs over reference labels (`--simulate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulation: Option<bool>,
    /// Whether document KV is reused across questions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<bool>,
    /// Whether later operators' questions are asked ahead (the simulation
    /// records it; a model's scheduler always has it from the flags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookahead: Option<bool>,
    /// The device KV budget, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_budget_bytes: Option<usize>,
    /// The host KV tier, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_host_budget_bytes: Option<usize>,
    /// Tokens per forward batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_tokens: Option<usize>,
    /// KV bytes per token the simulation assumes (Qwen3-4B's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated_kv_bytes_per_token: Option<usize>,
    /// Each worker's device, when there are several (or remote workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<String>>,
    /// How many workers answer (devices, CPU workers or remote workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// The `--workers` URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_addresses: Option<Vec<String>>,
    /// The answer cache's log file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_cache: Option<String>,
    /// The on-disk KV store's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_store: Option<String>,
}

impl BackendMeta {
    /// The description as a JSON object, for run.json's metadata.
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) => map,
            // A struct of options, strings and numbers is always an object.
            _ => unreachable!("BackendMeta serializes to a JSON object"),
        }
    }

    /// `device`, "" when absent.
    pub fn device(&self) -> &str {
        self.device.as_deref().unwrap_or_default()
    }

    /// `dtype`, "" when absent.
    pub fn dtype(&self) -> &str {
        self.dtype.as_deref().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_fields_are_left_out_and_the_order_is_kept() {
        assert_eq!(
            serde_json::to_string(&BackendMeta::default()).unwrap(),
            "{}"
        );
        let meta = BackendMeta {
            simulation: Some(true),
            prefix_cache: Some(true),
            lookahead: Some(false),
            kv_budget_bytes: Some(1),
            kv_host_budget_bytes: Some(2),
            batch_tokens: Some(3),
            simulated_kv_bytes_per_token: Some(4),
            workers: Some(1),
            ..Default::default()
        };
        let text = serde_json::to_string(&meta).unwrap();
        assert_eq!(
            text,
            r#"{"simulation":true,"prefix_cache":true,"lookahead":false,"kv_budget_bytes":1,"kv_host_budget_bytes":2,"batch_tokens":3,"simulated_kv_bytes_per_token":4,"workers":1}"#
        );
        let back: BackendMeta = serde_json::from_str(&text).unwrap();
        assert_eq!(back, meta);
        assert_eq!(serde_json::Value::Object(meta.to_json()).to_string(), text);
    }
}
