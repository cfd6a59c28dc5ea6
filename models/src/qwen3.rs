//! Qwen3 (dense, 0.6B … 32B) as a stateless forward over a *packed* batch: the
//! tokens of many sequences are concatenated into one `(total, hidden)` matrix, so
//! every projection is a single matmul, and each sequence may continue its own cached
//! prefix at its own length. The KV cache lives outside the model ([`KvHandle`]);
//! attention over `[prefix ‖ causal suffix]` is `aisql_kernels::prefix_suffix_attention`.
//!
//! Layout follows candle-transformers' `qwen3.rs` bottom-up (config, rotary, MLP,
//! attention, layer, model); weight names mirror the Hugging Face checkpoints.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use std::cell::RefCell;
use std::collections::BTreeSet;

use aisql_kernels::amx_gemm::AmxMatrix;
use aisql_kernels::bf16_gemm::Bf16Matrix;
use aisql_kernels::f32_gemm::F32Matrix;
use aisql_kernels::q8_gemm::Q8Matrix;
use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::Activation;
use serde::{Deserialize, Serialize};

use crate::gguf::GgufFile;
use crate::kv::{KvHandle, LayerKv, Segment};
use crate::precision::{Precision, block_format_for, block_format_name};
use crate::source::{ModelFiles, Weights, default_precision};
use crate::{ModelError, Result};

/// The `config.json` keys a Qwen3 checkpoint needs. Shape keys are required; the rest
/// default as in `transformers`' `Qwen3Config`. Unknown keys are ignored.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Config {
    /// Rows of the embedding / output head (151936 for released Qwen3 models).
    pub vocab_size: usize,
    /// Residual-stream width.
    pub hidden_size: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA when fewer than query heads).
    pub num_key_value_heads: usize,
    /// Per-head width (Qwen3 sets it explicitly; it need not be hidden/heads).
    pub head_dim: usize,
    /// RoPE base.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// Whether the output head reuses `model.embed_tokens.weight`.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Whether q/k/v/o projections carry biases (false for Qwen3).
    #[serde(default)]
    pub attention_bias: bool,
    /// MLP activation (SiLU for Qwen3).
    #[serde(default = "default_act")]
    pub hidden_act: Activation,
    /// Sliding-window attention; rejected when true.
    #[serde(default)]
    pub use_sliding_window: bool,
    /// RoPE scaling (YaRN etc.); rejected when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Value>,
    /// Context length the checkpoint was trained for (informational).
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
}

fn default_rope_theta() -> f64 {
    10_000.0
}
fn default_rms_norm_eps() -> f64 {
    1e-6
}
fn default_act() -> Activation {
    Activation::Silu
}
fn default_max_pos() -> usize {
    32_768
}

impl Config {
    /// Bytes of KV cache one position takes at `dtype` (keys and values of
    /// every layer).
    pub fn kv_bytes_per_token(&self, dtype: DType) -> usize {
        self.num_hidden_layers
            * 2
            * self.num_key_value_heads
            * self.head_dim
            * dtype.size_in_bytes()
    }

    /// Parses a `config.json`; a missing key or bad value names the file and the key.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let cfg: Self = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Every weight of a Qwen3 of this shape, Hugging Face name and shape, in
    /// checkpoint order: the embedding; per layer its input norm, q/k/v/o
    /// projections (and their biases), q/k norms, post-attention norm, gate/up/down
    /// projections; the final norm; the head when not tied.
    pub fn weight_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, d, i, v) = (
            self.hidden_size,
            self.head_dim,
            self.intermediate_size,
            self.vocab_size,
        );
        let (qd, kvd) = (self.num_attention_heads * d, self.num_key_value_heads * d);
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        for l in 0..self.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let mut push = |name: &str, shape: Vec<usize>| out.push((format!("{p}.{name}"), shape));
            push("input_layernorm.weight", vec![h]);
            for (name, rows, cols) in [
                ("q_proj", qd, h),
                ("k_proj", kvd, h),
                ("v_proj", kvd, h),
                ("o_proj", h, qd),
            ] {
                push(&format!("self_attn.{name}.weight"), vec![rows, cols]);
                if self.attention_bias {
                    push(&format!("self_attn.{name}.bias"), vec![rows]);
                }
            }
            push("self_attn.q_norm.weight", vec![d]);
            push("self_attn.k_norm.weight", vec![d]);
            push("post_attention_layernorm.weight", vec![h]);
            push("mlp.gate_proj.weight", vec![i, h]);
            push("mlp.up_proj.weight", vec![i, h]);
            push("mlp.down_proj.weight", vec![h, i]);
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, h]));
        }
        out
    }

    /// Rejects configs this implementation would compute wrongly.
    pub fn validate(&self) -> Result<()> {
        let u = |m: String| Err(ModelError::Unsupported(m));
        if self.use_sliding_window {
            return u("use_sliding_window = true".into());
        }
        if self.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return u(format!(
                "rope_scaling {}",
                self.rope_scaling.as_ref().unwrap()
            ));
        }
        if self.num_key_value_heads == 0
            || !self
                .num_attention_heads
                .is_multiple_of(self.num_key_value_heads)
        {
            return u(format!(
                "{} attention heads are not a multiple of {} KV heads",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return u(format!(
                "head_dim {} must be even and positive",
                self.head_dim
            ));
        }
        if [
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
        ]
        .contains(&0)
        {
            return u("zero-sized vocab/hidden/intermediate/layers".into());
        }
        Ok(())
    }
}

/// `y = x Wᵀ (+ b)` with the Hugging Face `(out, in)` weight layout.
#[derive(Debug, Clone)]
struct Linear {
    weight: LinearWeight,
    bias: Option<Tensor>,
}

/// A projection's weight: float in the compute dtype, or in a GGUF block format
/// (candle's quantized matmul: activations quantized per row, integer dot products).
#[derive(Debug, Clone)]
enum LinearWeight {
    Float(Tensor),
    Quantized(QMatMul),
    /// Q8_0 or bf16 weights re-laid as bf16 for the CPU's AMX tile units (where it
    /// has them).
    Amx(std::sync::Arc<AmxMatrix>),
    /// Q8_0 weights on AMX for prompt rows, and as Q8_0 for the VNNI kernel for
    /// decode rows ([`Linear::forward_rows`]): a decode step multiplies a few rows
    /// by every weight, so it is bound by the bytes it reads, and bf16 tiles are
    /// twice Q8_0's.
    AmxAndQ8 {
        tiles: std::sync::Arc<AmxMatrix>,
        q8: std::sync::Arc<Q8Matrix>,
    },
    /// f32 weights packed for the AVX-512 GEMM (where the CPU has AVX-512F).
    PackedF32(std::sync::Arc<F32Matrix>),
    /// Q8_0 weights re-laid for the AVX-512 VNNI GEMM (where the CPU has VNNI but
    /// no AMX).
    Q8(std::sync::Arc<Q8Matrix>),
    /// bf16 weights packed for the AVX-512 BF16 GEMM (where the CPU has it but no
    /// AMX).
    Bf16(std::sync::Arc<Bf16Matrix>),
}

impl Linear {
    fn load(w: &Loader, name: &str, out_dim: usize, in_dim: usize, bias: bool) -> Result<Self> {
        let weight = w.linear_weight(&format!("{name}.weight"), &[out_dim, in_dim])?;
        let bias = if bias {
            Some(w.get(&format!("{name}.bias"), &[out_dim])?)
        } else {
            None
        };
        Ok(Self { weight, bias })
    }
}

impl Linear {
    /// `x Wᵀ (+ b)` where the first `decode` rows of `x` are decode positions (a
    /// generated token fed back) and the rest prompt positions. A weight held twice
    /// ([`LinearWeight::AmxAndQ8`]) gives the decode rows to its Q8_0 kernel and
    /// the others to AMX; a row's kernel depends only on its kind, never on what it
    /// is batched with, so its bits do not either.
    fn forward_rows(&self, x: &Tensor, decode: usize) -> candle_core::Result<Tensor> {
        Ok(Self::forward_rows_side_by_side(&[self], x, decode)?.remove(0))
    }

    /// The Q8_0 panels of the VNNI kernel and how many of `total` packed rows
    /// (the first `decode` of them decode positions) it computes for this
    /// projection: all of them, or the decode rows of a weight held twice.
    fn q8_rows(&self, total: usize, decode: usize) -> Option<(&Q8Matrix, usize)> {
        match &self.weight {
            LinearWeight::Q8(q8) => Some((q8, total)),
            LinearWeight::AmxAndQ8 { q8, .. } => Some((q8, decode.min(total))),
            _ => None,
        }
    }

    /// [`Self::forward_rows`] of several projections of the same rows (a layer's
    /// query, key and value, or its gate and up). Where the Q8_0 kernel computes the
    /// same rows for every one, those rows are multiplied by all of them as one
    /// GEMM: quantized once, one set of tasks for the threads instead of one per
    /// projection. Each output has the bits of its own projection's.
    fn forward_rows_side_by_side(
        parts: &[&Linear],
        x: &Tensor,
        decode: usize,
    ) -> candle_core::Result<Vec<Tensor>> {
        let total = x.dim(0)?;
        let kernels: Option<Vec<(&Q8Matrix, usize)>> =
            parts.iter().map(|l| l.q8_rows(total, decode)).collect();
        let rows = kernels.as_ref().and_then(|k| k.first()).map(|&(_, r)| r);
        let q8: Option<Vec<&Q8Matrix>> = kernels
            .filter(|k| k.iter().all(|&(_, r)| Some(r) == rows))
            .map(|k| k.into_iter().map(|(w, _)| w).collect::<Vec<_>>())
            .filter(|q| Q8Matrix::side_by_side(q));
        let (Some(q8), Some(rows)) = (q8, rows) else {
            // Not one kernel for the same rows: each projection on its own (one
            // alone is always side by side with itself, so never comes here with
            // rows on the Q8_0 kernel).
            return match parts {
                [one] => Ok(vec![one.forward(x)?]),
                _ => parts.iter().map(|l| l.forward_rows(x, decode)).collect(),
            };
        };
        if rows == 0 {
            return parts.iter().map(|l| l.forward(x)).collect();
        }
        let head = aisql_kernels::q8_gemm::q8_linear_side_by_side(&x.narrow(0, 0, rows)?, &q8)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let rest = (rows < total)
            .then(|| x.narrow(0, rows, total - rows))
            .transpose()?;
        parts
            .iter()
            .zip(head)
            .map(|(l, y)| {
                let y = match &l.bias {
                    Some(b) => y.broadcast_add(b)?,
                    None => y,
                };
                match &rest {
                    Some(rest) => Tensor::cat(&[&y, &l.forward(rest)?], 0),
                    None => Ok(y),
                }
            })
            .collect()
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        // `Module` speaks candle's error type; the kernels' errors travel as text.
        let kernel = |r: aisql_kernels::Result<Tensor>| {
            r.map_err(|e| candle_core::Error::Msg(e.to_string()))
        };
        let y = match &self.weight {
            LinearWeight::Float(w) => x.matmul(&w.t()?)?,
            LinearWeight::Quantized(q) => q.forward(&x.contiguous()?)?,
            LinearWeight::Amx(w) | LinearWeight::AmxAndQ8 { tiles: w, .. } => {
                kernel(aisql_kernels::amx_gemm::amx_linear(x, w))?
            }
            LinearWeight::PackedF32(w) => kernel(aisql_kernels::f32_gemm::f32_linear(x, w))?,
            LinearWeight::Q8(w) => kernel(aisql_kernels::q8_gemm::q8_linear(x, w))?,
            LinearWeight::Bf16(w) => kernel(aisql_kernels::bf16_gemm::bf16_linear(x, w))?,
        };
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// RMSNorm over the last dimension.
#[derive(Debug, Clone)]
struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn load(w: &Loader, name: &str, dim: usize) -> Result<Self> {
        Ok(Self {
            weight: w.get(&format!("{name}.weight"), &[dim])?,
            eps: w.cfg.rms_norm_eps as f32,
        })
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)
    }
}

/// Where a model's weights come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// Safetensors files.
    Safetensors(&'a Weights),
    /// A GGUF file: projections keep their stored block format.
    Gguf(&'a GgufFile),
    /// Seeded random weights made on the device itself, see [`Qwen3::random`].
    Random,
}

/// Weight access bound to one source, precision and device.
struct Loader<'a> {
    source: Source<'a>,
    cfg: &'a Config,
    precision: Precision,
    dtype: DType,
    device: &'a Device,
    /// The block formats the projections ended up in (fallbacks included), for
    /// [`Qwen3::weights_name`].
    formats: RefCell<BTreeSet<String>>,
}

impl Loader<'_> {
    /// A float weight in the compute dtype (embeddings, norms, biases, head).
    fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.get_as(name, shape, self.dtype)
    }

    fn get_as(&self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        match self.source {
            Source::Safetensors(w) => w.get(name, shape, dtype, self.device),
            Source::Gguf(g) => Ok(g.float(name, shape, self.device)?.to_dtype(dtype)?),
            // Random weights: norms 1, everything else N(0, 0.02²), drawn on the device
            // (curand on CUDA) in f32 and converted, so no host copy of the weights.
            Source::Random if name.ends_with("norm.weight") => {
                Ok(Tensor::ones(shape, dtype, self.device)?)
            }
            Source::Random => {
                Ok(Tensor::randn(0f32, 0.02f32, shape, self.device)?.to_dtype(dtype)?)
            }
        }
    }

    /// Records that a projection is held in `format`.
    fn held_in(&self, format: String) {
        self.formats.borrow_mut().insert(format);
    }

    /// A projection weight `(out, in)`: as stored in a GGUF, quantized at load under
    /// a quantized precision, else float.
    fn linear_weight(&self, name: &str, shape: &[usize]) -> Result<LinearWeight> {
        let quantized = |q: QTensor| -> Result<LinearWeight> {
            self.held_in(block_format_name(q.dtype()));
            self.block_weight(q, shape[0], shape[1])
        };
        // bf16 weights on AMX or AVX-512 BF16: candle's CPU matmul widens both operands
        // to f32. f32 weights on AVX-512: candle's CPU matmul runs AVX2 kernels on
        // stable Rust.
        let float = |t: Tensor| -> Result<LinearWeight> {
            let (n, k) = (shape[0], shape[1]);
            if t.dtype() == DType::BF16 && self.on_amx(n, k) {
                let values = t.flatten_all()?.to_vec1::<half::bf16>()?;
                let tiles = AmxMatrix::from_bf16(&values, n, k)?;
                return Ok(LinearWeight::Amx(std::sync::Arc::new(tiles)));
            }
            if t.dtype() == DType::BF16
                && self.device.is_cpu()
                && aisql_kernels::bf16_gemm::bf16_gemm_available()
            {
                let values = t.flatten_all()?.to_vec1::<half::bf16>()?;
                let panels = Bf16Matrix::from_bf16(&values, n, k)?;
                return Ok(LinearWeight::Bf16(std::sync::Arc::new(panels)));
            }
            // The CPU computes in f32: half-precision weights without a kernel of
            // their own are widened once here (the same values), not at every call.
            let t = t.to_dtype(self.dtype)?;
            if t.dtype() == DType::F32
                && self.device.is_cpu()
                && aisql_kernels::f32_gemm::f32_gemm_available()
            {
                let values = t.flatten_all()?.to_vec1::<f32>()?;
                let panels = F32Matrix::new(&values, n, k)?;
                return Ok(LinearWeight::PackedF32(std::sync::Arc::new(panels)));
            }
            Ok(LinearWeight::Float(t))
        };
        if let Source::Gguf(g) = self.source {
            // The header says the format, so the tensor's data is read once.
            return match g.stored_type(name) {
                Some(t) if t.block_size() > 1 => quantized(g.qtensor(name, shape, self.device)?),
                stored => {
                    // A missing tensor is named by `get`.
                    if let Some(t) = stored {
                        self.held_in(block_format_name(t));
                    }
                    float(self.get(name, shape)?)
                }
            };
        }
        match self.precision.quantized() {
            Some(wanted) => match block_format_for(wanted, shape[1]) {
                Some(format) => {
                    let t = self.get_as(name, shape, DType::F32)?;
                    quantized(QTensor::quantize(&t, format)?)
                }
                None => {
                    self.held_in("f32".into());
                    float(self.get(name, shape)?)
                }
            },
            None => float(self.get_as(name, shape, self.precision.weight_dtype())?),
        }
    }

    /// A block-format weight `(n, k)` on the fastest kernel this CPU has for it.
    fn block_weight(&self, q: QTensor, n: usize, k: usize) -> Result<LinearWeight> {
        let q8_0 = q.dtype() == candle_core::quantized::GgmlDType::Q8_0;
        let on_vnni = q8_0
            && self.device.is_cpu()
            && Q8Matrix::fits(n, k)
            && aisql_kernels::q8_gemm::q8_gemm_available();
        if q8_0 && self.on_amx(n, k) {
            let tiles = std::sync::Arc::new(AmxMatrix::from_q8_0(&q.data()?, n, k)?);
            if on_vnni {
                let q8 = std::sync::Arc::new(Q8Matrix::from_q8_0(&q.data()?, n, k)?);
                return Ok(LinearWeight::AmxAndQ8 { tiles, q8 });
            }
            return Ok(LinearWeight::Amx(tiles));
        }
        if on_vnni {
            let panels = Q8Matrix::from_q8_0(&q.data()?, n, k)?;
            return Ok(LinearWeight::Q8(std::sync::Arc::new(panels)));
        }
        Ok(LinearWeight::Quantized(QMatMul::from_qtensor(q)?))
    }

    /// The output head in the GGUF's own block format (`name` is `lm_head.weight`,
    /// or the embedding for a tied head), for greedy decoding: one decode step reads
    /// the whole head, and a Q8_0 head is a quarter of the bytes of the f32 copy
    /// that embeddings and scoring use. `None` when the file holds it as floats.
    fn decode_head(&self, name: &str, shape: &[usize]) -> Result<Option<Linear>> {
        let Source::Gguf(g) = self.source else {
            return Ok(None);
        };
        match g.stored_type(name) {
            Some(t) if t.block_size() > 1 => {
                let q = g.qtensor(name, shape, self.device)?;
                let (n, k) = (shape[0], shape[1]);
                // Only decode rows read it: the Q8_0 kernel where there is one, even
                // on AMX (whose bf16 tiles are twice the bytes).
                let weight = if q.dtype() == candle_core::quantized::GgmlDType::Q8_0
                    && self.device.is_cpu()
                    && Q8Matrix::fits(n, k)
                    && aisql_kernels::q8_gemm::q8_gemm_available()
                {
                    LinearWeight::Q8(std::sync::Arc::new(Q8Matrix::from_q8_0(&q.data()?, n, k)?))
                } else {
                    self.block_weight(q, n, k)?
                };
                Ok(Some(Linear { weight, bias: None }))
            }
            _ => Ok(None),
        }
    }

    /// Whether an `(n, k)` projection runs on the CPU's AMX tile units.
    fn on_amx(&self, n: usize, k: usize) -> bool {
        self.device.is_cpu() && AmxMatrix::fits(n, k) && aisql_kernels::amx_gemm::amx_available()
    }
}

/// Rotary embedding: cos/sin for arbitrary (per-row) positions, so packed rows of
/// different sequences each get their own offsets.
#[derive(Debug, Clone)]
struct Rotary {
    inv_freq: Vec<f32>,
}

impl Rotary {
    fn new(cfg: &Config) -> Self {
        let d = cfg.head_dim;
        // Same formula and f32 rounding as candle-transformers, so both agree bit for bit.
        let inv_freq = (0..d)
            .step_by(2)
            .map(|i| 1f32 / cfg.rope_theta.powf(i as f64 / d as f64) as f32)
            .collect();
        Self { inv_freq }
    }

    /// `(cos, sin)`, each `(positions.len(), head_dim / 2)`.
    fn tables(
        &self,
        positions: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let shape = (positions.len(), half);
        Ok((
            Tensor::from_vec(cos, shape, device)?.to_dtype(dtype)?,
            Tensor::from_vec(sin, shape, device)?.to_dtype(dtype)?,
        ))
    }

    /// Rotates `x` of shape `(heads, total, head_dim)`.
    fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::rotary_emb::rope(&x.unsqueeze(0)?.contiguous()?, cos, sin)?.squeeze(0)
    }
}

#[derive(Debug, Clone)]
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    act: Activation,
}

impl Mlp {
    fn load(w: &Loader, p: &str) -> Result<Self> {
        let (h, i) = (w.cfg.hidden_size, w.cfg.intermediate_size);
        Ok(Self {
            gate_proj: Linear::load(w, &format!("{p}.gate_proj"), i, h, false)?,
            up_proj: Linear::load(w, &format!("{p}.up_proj"), i, h, false)?,
            down_proj: Linear::load(w, &format!("{p}.down_proj"), h, i, false)?,
            act: w.cfg.hidden_act,
        })
    }
}

impl Mlp {
    /// The MLP of packed rows `x`, the first `decode` of them decode positions.
    fn forward(&self, x: &Tensor, decode: usize) -> Result<Tensor> {
        let parts = [&self.gate_proj, &self.up_proj];
        let [gate, up]: [Tensor; 2] = Linear::forward_rows_side_by_side(&parts, x, decode)?
            .try_into()
            .expect("one output per projection");
        let h = match self.act {
            Activation::Silu => aisql_kernels::elementwise::swiglu(&gate, &up)?,
            act => (gate.apply(&act)? * up)?,
        };
        Ok(self.down_proj.forward_rows(&h, decode)?)
    }
}

#[derive(Debug, Clone)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    fn load(w: &Loader, p: &str) -> Result<Self> {
        let c = w.cfg;
        let (h, d, nh, nkv, b) = (
            c.hidden_size,
            c.head_dim,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.attention_bias,
        );
        Ok(Self {
            q_proj: Linear::load(w, &format!("{p}.q_proj"), nh * d, h, b)?,
            k_proj: Linear::load(w, &format!("{p}.k_proj"), nkv * d, h, b)?,
            v_proj: Linear::load(w, &format!("{p}.v_proj"), nkv * d, h, b)?,
            o_proj: Linear::load(w, &format!("{p}.o_proj"), h, nh * d, b)?,
            q_norm: RmsNorm::load(w, &format!("{p}.q_norm"), d)?,
            k_norm: RmsNorm::load(w, &format!("{p}.k_norm"), d)?,
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: d,
        })
    }

    /// Attention for packed rows `x` `(total, hidden)`, the first `decode` of them
    /// decode positions; returns the output and this call's keys/values
    /// `(num_kv_heads, total, head_dim)` for caching.
    fn forward(
        &self,
        x: &Tensor,
        rope: &RopeBatch,
        seqs: &[aisql_kernels::SeqKv],
        decode: usize,
    ) -> Result<(Tensor, LayerKv)> {
        let total = x.dim(0)?;
        let d = self.head_dim;
        // 1. Project; 2. per-head RMSNorm on q and k (Qwen3's addition over Qwen2).
        let parts = [&self.q_proj, &self.k_proj, &self.v_proj];
        let [q, k, v]: [Tensor; 3] = Linear::forward_rows_side_by_side(&parts, x, decode)?
            .try_into()
            .expect("one output per projection");
        let q = self
            .q_norm
            .forward(&q.reshape((total, self.num_heads, d))?)?;
        let k = self
            .k_norm
            .forward(&k.reshape((total, self.num_kv_heads, d))?)?;
        let v = v.reshape((total, self.num_kv_heads, d))?;
        // 3. Head-major, the layout of the cache and the kernel (copied on all the
        // CPU's threads: candle's strided copy runs on one).
        use aisql_kernels::elementwise::transpose_01;
        let (q, k, v) = (transpose_01(&q)?, transpose_01(&k)?, transpose_01(&v)?);
        // 4. RoPE at each row's own position.
        let q = rope.rotary.apply(&q, &rope.cos, &rope.sin)?;
        let k = rope.rotary.apply(&k, &rope.cos, &rope.sin)?;
        // 5. Attention over [cached prefix ‖ causal suffix].
        let scale = 1.0 / (d as f32).sqrt();
        let y = aisql_kernels::prefix_suffix_attention(&q, &k, &v, seqs, scale)?;
        // 6. Back to rows and out-project.
        let y = transpose_01(&y)?.reshape((total, self.num_heads * d))?;
        Ok((self.o_proj.forward_rows(&y, decode)?, (k, v)))
    }
}

#[derive(Debug, Clone)]
struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    fn load(w: &Loader, i: usize) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let h = w.cfg.hidden_size;
        Ok(Self {
            self_attn: Attention::load(w, &format!("{p}.self_attn"))?,
            mlp: Mlp::load(w, &format!("{p}.mlp"))?,
            input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), h)?,
            post_attention_layernorm: RmsNorm::load(
                w,
                &format!("{p}.post_attention_layernorm"),
                h,
            )?,
        })
    }
}

/// Per-call RoPE tables for the packed rows.
struct RopeBatch<'a> {
    rotary: &'a Rotary,
    cos: Tensor,
    sin: Tensor,
}

/// One sequence of a packed forward: the cached segments it continues and its length.
pub(crate) struct PackedSeq {
    pub(crate) prefix: Vec<Segment>,
    pub(crate) len: usize,
}

/// Output of a packed forward.
pub(crate) struct Packed {
    /// Final-normed hidden states `(total, hidden)`, rows in input order.
    pub(crate) hidden: Tensor,
    /// Per sequence, per layer, the new keys/values (when requested).
    pub(crate) kv: Option<Vec<Vec<LayerKv>>>,
}

static NEXT_MODEL_UID: AtomicU64 = AtomicU64::new(1);

/// A Qwen3 model. Holds only weights: every call is `&self`, the KV cache is passed
/// in and out as [`KvHandle`]s, so one model can serve many threads and prefixes.
pub struct Qwen3 {
    cfg: Config,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Tensor,
    /// The head in the file's block format, which greedy decoding reads (scoring
    /// and embeddings read [`Self::lm_head`]); `None` for float heads.
    decode_head: Option<Linear>,
    rotary: Rotary,
    device: Device,
    dtype: DType,
    /// What the projection weights are held in (`f32`, `q8_0`, `gguf:q4k+q6k`, …).
    weights_name: String,
    uid: u64,
    next_kv_id: AtomicU64,
    fresh_tokens: AtomicU64,
    label_tokens: AtomicU64,
    decode_tokens: AtomicU64,
}

impl std::fmt::Debug for Qwen3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen3")
            .field("cfg", &self.cfg)
            .field("device", &self.device)
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl Qwen3 {
    /// Loads a local model (a directory with `config.json` + safetensors, or a GGUF
    /// file) on `device`, in `precision` or the device default (f32 on CPU, bf16 on GPU).
    pub fn load(
        dir: impl AsRef<Path>,
        device: &Device,
        precision: Option<Precision>,
    ) -> Result<Self> {
        Self::from_files(&ModelFiles::from_dir(dir)?, device, precision)
    }

    /// Loads from resolved [`ModelFiles`] (a directory, a GGUF file or the HF cache).
    /// A GGUF model's projections keep the file's block formats; `precision` may
    /// then only be `f32`, the compute dtype.
    pub fn from_files(
        files: &ModelFiles,
        device: &Device,
        precision: Option<Precision>,
    ) -> Result<Self> {
        if let Some(path) = files.gguf_file() {
            return Self::from_gguf(&GgufFile::open(path)?, device, precision);
        }
        let config = files
            .config
            .as_ref()
            .expect("safetensors models have a config");
        let cfg = Config::from_file(config)?;
        let weights = Weights::open(&files.weights)?;
        Self::new(
            cfg,
            Source::Safetensors(&weights),
            device,
            precision.unwrap_or_else(|| default_precision(device)),
        )
    }

    /// Loads the model of an open GGUF file, its projections in the file's block
    /// formats; `precision` may only be `f32`, the compute dtype.
    pub fn from_gguf(
        file: &GgufFile,
        device: &Device,
        precision: Option<Precision>,
    ) -> Result<Self> {
        let precision = Self::gguf_precision(file, precision)?;
        Self::new(file.config()?, Source::Gguf(file), device, precision)
    }

    /// The precision a GGUF model runs in: f32, the compute dtype of its
    /// block formats; another `--dtype` is refused.
    pub(crate) fn gguf_precision(
        file: &GgufFile,
        precision: Option<Precision>,
    ) -> Result<Precision> {
        if let Some(p) = precision.filter(|&p| p != Precision::F32) {
            return Err(ModelError::Unsupported(format!(
                "--dtype {p} with a GGUF model: its weights are stored quantized in {}; \
                 --dtype applies to safetensors models",
                file.path().display()
            )));
        }
        Ok(Precision::F32)
    }

    /// A model of shape `cfg` with seeded random weights generated directly on
    /// `device` (no file, no host copy): for throughput measurements at real model
    /// shapes without a download. Norm weights are 1, the rest N(0, 0.02²). The
    /// random stream is the device's (`Device::set_seed(seed)` is called first on a
    /// GPU), so the same seed gives the same weights on one GPU kind; candle's CPU
    /// generator cannot be seeded, so CPU weights are not reproducible.
    pub fn random(
        cfg: Config,
        device: &Device,
        precision: Option<Precision>,
        seed: u64,
    ) -> Result<Self> {
        if !device.is_cpu() {
            device.set_seed(seed)?;
        }
        let precision = precision.unwrap_or_else(|| default_precision(device));
        Self::new(cfg, Source::Random, device, precision)
    }

    fn new(cfg: Config, source: Source, device: &Device, precision: Precision) -> Result<Self> {
        cfg.validate()?;
        let quantized = precision.quantized().is_some() || matches!(source, Source::Gguf(_));
        if quantized && !device.is_cpu() {
            return Err(ModelError::Unsupported(
                "quantized weights (GGUF, --dtype q8_0 or q4k) run on the CPU in this build; \
                 on a GPU use bf16 or f16"
                    .into(),
            ));
        }
        let dtype = precision.compute_dtype(device);
        let w = Loader {
            source,
            cfg: &cfg,
            precision,
            dtype,
            device,
            formats: RefCell::new(BTreeSet::new()),
        };
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed_tokens = w.get("model.embed_tokens.weight", &[v, h])?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::load(&w, i))
            .collect::<Result<_>>()?;
        let norm = RmsNorm::load(&w, "model.norm", h)?;
        // Tied checkpoints sometimes still store `lm_head.weight`; like transformers we
        // follow the config and share the embedding.
        let (lm_head, head_name) = if cfg.tie_word_embeddings {
            (embed_tokens.clone(), "model.embed_tokens.weight")
        } else {
            (w.get("lm_head.weight", &[v, h])?, "lm_head.weight")
        };
        let decode_head = w.decode_head(head_name, &[v, h])?;
        let formats = w.formats.into_inner();
        let formats = formats.into_iter().collect::<Vec<_>>().join("+");
        let weights_name = match source {
            Source::Gguf(_) => format!("gguf:{formats}"),
            _ if formats.is_empty() => precision.name().to_string(),
            _ => formats,
        };
        Ok(Self {
            weights_name,
            rotary: Rotary::new(&cfg),
            cfg,
            embed_tokens,
            layers,
            norm,
            lm_head,
            decode_head,
            device: device.clone(),
            dtype,
            uid: NEXT_MODEL_UID.fetch_add(1, Ordering::Relaxed),
            next_kv_id: AtomicU64::new(1),
            fresh_tokens: AtomicU64::new(0),
            label_tokens: AtomicU64::new(0),
            decode_tokens: AtomicU64::new(0),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The compute dtype (f32 for quantized weights).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// What the projection weights are held in: `f32`, `bf16` or `f16`; the block
    /// formats used when quantized at load (`q8_0`, `q4k+q5_0`, …); `gguf:` and the
    /// file's formats for a GGUF model. Part of a model's identity in run records,
    /// answer caches and calibration profiles.
    pub fn weights_name(&self) -> &str {
        &self.weights_name
    }

    /// Positions computed by every forward pass so far (fresh tokens: cached prefix
    /// positions are not counted again). The benchmark's fresh-token figure.
    pub fn fresh_tokens(&self) -> u64 {
        self.fresh_tokens.load(Ordering::Relaxed)
    }

    /// The part of [`Self::fresh_tokens`] spent feeding label continuations when
    /// scoring classifications (every label token but the last). QUAIL-B's token
    /// accounting stops at the answer cue, so these are reported apart.
    pub fn label_tokens(&self) -> u64 {
        self.label_tokens.load(Ordering::Relaxed)
    }

    pub(crate) fn count_label_tokens(&self, n: usize) {
        self.label_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The part of [`Self::fresh_tokens`] spent feeding generated tokens back in
    /// ([`Self::generate`]): one position per decode step of each sequence. Prompt
    /// positions prefilled for a generation are fresh tokens, not decode tokens.
    pub fn decode_tokens(&self) -> u64 {
        self.decode_tokens.load(Ordering::Relaxed)
    }

    pub(crate) fn count_decode_tokens(&self, n: usize) {
        self.decode_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The output-head matrix `(vocab, hidden)` (the embedding when tied).
    pub fn lm_head(&self) -> &Tensor {
        &self.lm_head
    }

    /// Whether greedy decoding reads a head in the file's block format
    /// ([`Self::block_head_logits`]) rather than [`Self::lm_head`].
    pub(crate) fn has_block_head(&self) -> bool {
        self.decode_head.is_some()
    }

    /// Logits `(n, vocab)` f32 of final-normed `hidden` `(n, hidden)` from the head
    /// in the file's block format, or `None` when the model has none
    /// ([`Self::lm_head`] is the head then).
    pub(crate) fn block_head_logits(&self, hidden: &Tensor) -> Result<Option<Tensor>> {
        match &self.decode_head {
            Some(head) => Ok(Some(head.forward(&hidden.contiguous()?)?)),
            None => Ok(None),
        }
    }

    /// KV bytes one cached position takes: layers × 2 × kv_heads × head_dim × dtype size.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.cfg.kv_bytes_per_token(self.dtype)
    }

    pub(crate) fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            Some(&id) => Err(ModelError::TokenOutOfVocab {
                id,
                vocab_size: self.cfg.vocab_size,
            }),
            None => Ok(()),
        }
    }

    pub(crate) fn check_handle(&self, h: &KvHandle) -> Result<()> {
        if h.model_uid() != self.uid {
            return Err(ModelError::InvalidInput(format!(
                "KV prefix #{} belongs to another model",
                h.id()
            )));
        }
        Ok(())
    }

    pub(crate) fn new_handle(&self, parent: Option<KvHandle>, segment: Segment) -> KvHandle {
        KvHandle::new(
            self.uid,
            self.next_kv_id.fetch_add(1, Ordering::Relaxed),
            parent,
            segment,
        )
    }

    /// Runs the decoder over packed sequences. `tokens` holds every sequence's tokens
    /// back to back (`seqs[i].len` each); sequence `i` continues `seqs[i].prefix`.
    /// The first `decode_rows` rows are decode positions (generated tokens fed
    /// back), which a projection held in two formats computes with its decode
    /// kernel ([`Linear::forward_rows`]).
    pub(crate) fn forward_packed(
        &self,
        tokens: &[u32],
        seqs: &[PackedSeq],
        keep_kv: bool,
        decode_rows: usize,
    ) -> Result<Packed> {
        // On the CPU the whole pass runs on one of rayon's threads: each of its
        // few hundred parallel kernels is then a fork the other threads steal
        // from, instead of a hand-off from this thread to the pool and back (two
        // thread wake-ups per kernel: a one-sequence Q8_0 decode went from 20 to
        // 24 tokens/s).
        if self.device.is_cpu() && rayon::current_thread_index().is_none() {
            return rayon::scope(|_| self.forward_packed_here(tokens, seqs, keep_kv, decode_rows));
        }
        self.forward_packed_here(tokens, seqs, keep_kv, decode_rows)
    }

    /// [`Self::forward_packed`] on the calling thread.
    fn forward_packed_here(
        &self,
        tokens: &[u32],
        seqs: &[PackedSeq],
        keep_kv: bool,
        decode_rows: usize,
    ) -> Result<Packed> {
        let total: usize = seqs.iter().map(|s| s.len).sum();
        if total != tokens.len() || total == 0 {
            return Err(ModelError::InvalidInput(format!(
                "{} tokens packed for {total} positions",
                tokens.len()
            )));
        }
        self.check_tokens(tokens)?;
        let mut positions = Vec::with_capacity(total);
        let mut starts = Vec::with_capacity(seqs.len());
        for s in seqs {
            let offset: usize = s
                .prefix
                .iter()
                .map(|p| p.layers.first().map_or(0, |(k, _)| k.dim(1).unwrap_or(0)))
                .sum();
            starts.push(positions.len());
            positions.extend(offset..offset + s.len);
        }
        let (cos, sin) = self.rotary.tables(&positions, self.dtype, &self.device)?;
        let rope = RopeBatch {
            rotary: &self.rotary,
            cos,
            sin,
        };

        let ids = Tensor::from_slice(tokens, total, &self.device)?;
        let mut x = self.embed_tokens.index_select(&ids, 0)?;
        let mut kv: Vec<Vec<LayerKv>> = if keep_kv {
            seqs.iter()
                .map(|_| Vec::with_capacity(self.layers.len()))
                .collect()
        } else {
            Vec::new()
        };
        for (l, layer) in self.layers.iter().enumerate() {
            let kseqs: Vec<aisql_kernels::SeqKv> = seqs
                .iter()
                .zip(&starts)
                .map(|(s, &start)| aisql_kernels::SeqKv {
                    prefix: s.prefix.iter().map(|p| p.layers[l].clone()).collect(),
                    start,
                    len: s.len,
                })
                .collect();
            let h = layer.input_layernorm.forward(&x)?;
            let (h, (k, v)) = layer.self_attn.forward(&h, &rope, &kseqs, decode_rows)?;
            x = aisql_kernels::elementwise::add(&x, &h)?;
            let h = layer
                .mlp
                .forward(&layer.post_attention_layernorm.forward(&x)?, decode_rows)?;
            x = aisql_kernels::elementwise::add(&x, &h)?;
            if keep_kv {
                for (i, (s, &start)) in seqs.iter().zip(&starts).enumerate() {
                    // Copy out each sequence's slice so a cached segment does not pin
                    // the whole batch's K/V buffers.
                    let own = |t: &Tensor| -> candle_core::Result<Tensor> {
                        let part = t.narrow(1, start, s.len)?;
                        match (seqs.len(), part.is_contiguous()) {
                            (1, _) => Ok(part),
                            (_, true) => part.copy(),
                            (_, false) => part.contiguous(),
                        }
                    };
                    kv[i].push((own(&k)?, own(&v)?));
                }
            }
        }
        self.fresh_tokens.fetch_add(total as u64, Ordering::Relaxed);
        Ok(Packed {
            hidden: self.norm.forward(&x)?,
            kv: keep_kv.then_some(kv),
        })
    }

    /// Loads `dir` on the CPU in f32, panicking on error (tests only).
    #[cfg(test)]
    pub(crate) fn load_for_test(dir: &Path) -> Self {
        Self::load(dir, &Device::Cpu, None).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::tiny_dir;

    /// Copies the tiny model so a test can damage one file.
    fn scratch_copy() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            std::fs::copy(tiny_dir().join(f), dir.path().join(f)).unwrap();
        }
        dir
    }

    #[test]
    fn config_missing_a_key_names_file_and_key() {
        let dir = scratch_copy();
        let path = dir.path().join("config.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        json.as_object_mut().unwrap().remove("num_key_value_heads");
        std::fs::write(&path, json.to_string()).unwrap();
        let err = Qwen3::load(dir.path(), &Device::Cpu, None).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ModelError::Config { .. }), "{msg}");
        assert!(
            msg.contains("num_key_value_heads") && msg.contains("config.json"),
            "{msg}"
        );
    }

    #[test]
    fn sliding_window_is_rejected() {
        let cfg = Config {
            use_sliding_window: true,
            ..crate::tiny::tiny_config()
        };
        assert!(matches!(cfg.validate(), Err(ModelError::Unsupported(_))));
    }

    #[test]
    fn corrupt_safetensors_names_the_file() {
        let dir = scratch_copy();
        std::fs::write(
            dir.path().join("model.safetensors"),
            b"\x10\x00\x00\x00\x00\x00\x00\x00{not json",
        )
        .unwrap();
        let err = Qwen3::load(dir.path(), &Device::Cpu, None).unwrap_err();
        assert!(matches!(err, ModelError::SafeTensors { .. }), "{err}");
        assert!(err.to_string().contains("model.safetensors"), "{err}");
    }

    #[test]
    fn shape_mismatch_names_tensor_and_both_shapes() {
        let dir = scratch_copy();
        let path = dir.path().join("config.json");
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"intermediate_size\": 192", "\"intermediate_size\": 128");
        std::fs::write(&path, text).unwrap();
        let err = Qwen3::load(dir.path(), &Device::Cpu, None).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("model.layers.0.mlp.gate_proj.weight")
                && msg.contains("[192, 64]")
                && msg.contains("[128, 64]"),
            "{msg}"
        );
    }

    #[test]
    fn missing_tensor_and_missing_files_are_named() {
        let dir = scratch_copy();
        let path = dir.path().join("config.json");
        let text = std::fs::read_to_string(&path).unwrap().replace(
            "\"tie_word_embeddings\": true",
            "\"tie_word_embeddings\": false",
        );
        std::fs::write(&path, text).unwrap();
        let err = Qwen3::load(dir.path(), &Device::Cpu, None).unwrap_err();
        assert!(
            matches!(&err, ModelError::MissingTensor { name } if name == "lm_head.weight"),
            "{err}"
        );
        std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
        let err = Qwen3::load(dir.path(), &Device::Cpu, None).unwrap_err();
        assert!(err.to_string().contains("model.safetensors"), "{err}");
        let err = Qwen3::load("/definitely/not/here", &Device::Cpu, None).unwrap_err();
        assert!(err.to_string().contains("/definitely/not/here"), "{err}");
    }

    #[test]
    fn random_model_runs_on_cpu() {
        let cfg = Config {
            vocab_size: 1000,
            ..crate::tiny::tiny_config()
        };
        let model = Qwen3::random(cfg, &Device::Cpu, None, 3).unwrap();
        assert_eq!(model.dtype(), DType::F32);
        let h = model.prefill(None, &[1, 2, 3]).unwrap();
        let logits = model
            .next_token_logits(&[crate::Continuation::new(Some(&h), &[4])], &[5, 6])
            .unwrap();
        assert!(logits[0].iter().all(|x| x.is_finite()));
    }

    #[test]
    fn loads_in_half_precision() {
        // On the CPU, bf16 is the projections' format; activations and the cache are
        // f32.
        let model = Qwen3::load(tiny_dir(), &Device::Cpu, Some(Precision::Bf16)).unwrap();
        assert_eq!(model.dtype(), DType::F32);
        assert_eq!(model.weights_name(), "bf16");
        let h = model.prefill(None, &[1, 2, 3]).unwrap();
        let logits = model
            .next_token_logits(&[crate::Continuation::new(Some(&h), &[4])], &[5, 6])
            .unwrap();
        assert!(logits[0].iter().all(|x| x.is_finite()));
        assert_eq!(model.kv_bytes_per_token(), 2 * 2 * 2 * 16 * 4);
    }
}
