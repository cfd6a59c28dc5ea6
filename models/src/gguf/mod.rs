//! GGUF files (llama.cpp's format): reading a Qwen3 from one, its shape from the
//! metadata ([`GgufFile::config`]), its tokenizer ([`tokenizer`]), its tensors by
//! their Hugging Face names; and writing one ([`write`]).
//!
//! The header is parsed here rather than by candle's reader so that every problem
//! (a truncated file, a tensor past the end, an unsupported block type, a shape the
//! metadata contradicts) is an error naming the file and the tensor or key, and so
//! that counts read from the file never size an allocation before they are checked
//! against the bytes that are actually there.

#[cfg(test)]
mod roundtrip;
mod scales;
pub mod tokenizer;
pub mod write;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor, ggml_file::qtensor_from_ggml};
use candle_core::{Device, Tensor};

use crate::qwen3::Config;
use crate::{ModelError, Result};

const MAGIC: u32 = 0x4655_4747; // "GGUF", little-endian
/// Default alignment of the tensor data (`general.alignment` overrides it).
const DEFAULT_ALIGNMENT: u64 = 32;
/// The most items one metadata array may hold, and all arrays together. A
/// model's largest array, its vocabulary, has well under a million (Qwen3's
/// 151,936); each item becomes a value of tens of bytes in memory, so a count
/// bounded by the file's size alone could still ask for gigabytes.
const MAX_METADATA_ITEMS: usize = 1 << 22;
/// The fewest bytes one metadata entry takes: its key's length (u64; a key may
/// be empty), its value type (u32) and the smallest value (one byte).
const MIN_METADATA_ENTRY_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes one tensor's directory entry takes: its name's length
/// (u64), its number of dimensions (u32), one dimension (u64), its type (u32)
/// and its offset (u64).
const MIN_TENSOR_ENTRY_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// One tensor's place in the file.
#[derive(Debug, Clone)]
struct TensorInfo {
    dtype: GgmlDType,
    /// Candle order: outermost first (GGUF stores the innermost dimension first).
    dims: Vec<usize>,
    /// Byte range in the file.
    start: usize,
    len: usize,
}

/// An open GGUF file: metadata and tensor directory parsed and checked, data mapped.
pub struct GgufFile {
    path: PathBuf,
    map: memmap2::Mmap,
    metadata: HashMap<String, Value>,
    tensors: HashMap<String, TensorInfo>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// GGML type ids that are not block formats candle computes with, by name, so the
/// error can say which one a file holds.
fn unsupported_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    })
}

/// The block formats this crate reads, by GGML type id.
fn ggml_type(id: u32) -> Option<GgmlDType> {
    Some(match id {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// Bounds-checked little-endian reads over the mapped file.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Metadata array items read so far (at most [`MAX_METADATA_ITEMS`]).
    items: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> std::result::Result<&'a [u8], String> {
        match self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
        {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(format!(
                "truncated: {what} at byte {} needs {n} bytes, the file has {}",
                self.pos,
                self.bytes.len()
            )),
        }
    }
    fn u8(&mut self, what: &str) -> std::result::Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }
    /// A count that sizes something read next (`field` of `what`: "the length
    /// of ", "metadata key x"), each of whose items takes at least `item_bytes`
    /// bytes of the file: checked against the bytes left before anything is
    /// sized by it.
    fn count(
        &mut self,
        field: &str,
        what: &str,
        item_bytes: u64,
    ) -> std::result::Result<usize, String> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.checked_mul(item_bytes).is_none_or(|need| need > left) {
            return Err(format!(
                "truncated or corrupt: {field}{what} is {n}, but {n} items of at least \
                 {item_bytes} byte{} each do not fit in the {left} bytes left in the file",
                if item_bytes == 1 { "" } else { "s" }
            ));
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> std::result::Result<String, String> {
        let n = self.count("the length of ", what, 1)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }
    fn value(
        &mut self,
        type_id: u32,
        what: &str,
        depth: u32,
    ) -> std::result::Result<Value, String> {
        let b = |c: &mut Self, n| c.take(n, what).map(|s| s.to_vec());
        Ok(match type_id {
            0 => Value::U8(self.u8(what)?),
            1 => Value::I8(self.u8(what)? as i8),
            2 => Value::U16(u16::from_le_bytes(b(self, 2)?.try_into().expect("2"))),
            3 => Value::I16(i16::from_le_bytes(b(self, 2)?.try_into().expect("2"))),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(self.u32(what)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(what)?)),
            7 => Value::Bool(self.u8(what)? != 0),
            8 => Value::String(self.string(what)?),
            9 => {
                if depth > 2 {
                    return Err(format!("{what}: arrays nested deeper than 2"));
                }
                let item_type = self.u32(what)?;
                let n = self.count("the array length of ", what, min_value_bytes(item_type))?;
                self.items = self.items.saturating_add(n);
                if self.items > MAX_METADATA_ITEMS {
                    return Err(format!(
                        "{what}: an array of {n} items brings the metadata's array items to {}, \
                         more than the {MAX_METADATA_ITEMS} aisql reads (a model's largest \
                         array, its vocabulary, has well under a million)",
                        self.items
                    ));
                }
                let mut items = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    items.push(self.value(item_type, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(self.u64(what)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(what)?)),
            other => return Err(format!("{what} has unknown value type {other}")),
        })
    }
}

/// The fewest bytes a metadata value of type `type_id` takes in the file.
fn min_value_bytes(type_id: u32) -> u64 {
    match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        // An array: its item type (u32) and length (u64).
        9 => 12,
        // An unknown type fails on its first item.
        _ => 1,
    }
}

impl GgufFile {
    /// Opens and checks `path`: magic, version, metadata, and that every tensor has
    /// a block type this crate reads and lies wholly inside the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        // A FIFO or a device (or a link to one) is refused before it is opened.
        let file = crate::regular_file::open(&path).map_err(|e| ModelError::io(&path, e))?;
        // SAFETY: read-only mapping; as with every mmap-based loader the file must not
        // be truncated while the model loads. Tensors are copied out when loaded.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(&path, e))?;
        let bad = |message: String| ModelError::Gguf {
            path: path.clone(),
            message,
        };
        let (metadata, tensors) = parse(&map).map_err(bad)?;
        Ok(Self {
            path,
            map,
            metadata,
            tensors,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, message: impl Into<String>) -> ModelError {
        ModelError::Gguf {
            path: self.path.clone(),
            message: message.into(),
        }
    }

    /// A metadata value.
    pub fn metadata(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    fn required(&self, key: &str) -> Result<&Value> {
        self.metadata
            .get(key)
            .ok_or_else(|| self.err(format!("metadata key {key} is missing")))
    }

    fn usize_key(&self, key: &str) -> Result<usize> {
        let v = self.required(key)?;
        as_u64(v)
            .map(|n| n as usize)
            .ok_or_else(|| self.err(format!("metadata key {key} is {v:?}, not an integer")))
    }

    fn f64_key(&self, key: &str) -> Result<Option<f64>> {
        match self.metadata.get(key) {
            None => Ok(None),
            // The shortest decimal that reads back as this f32 (1e-6, not
            // 9.99999997e-7): what the writer meant, as a config.json would hold it.
            Some(Value::F32(x)) => Ok(Some(x.to_string().parse().unwrap_or(f64::from(*x)))),
            Some(Value::F64(x)) => Ok(Some(*x)),
            Some(v) => Err(self.err(format!("metadata key {key} is {v:?}, not a number"))),
        }
    }

    /// A string metadata value, `None` when absent.
    pub(crate) fn str_key(&self, key: &str) -> Result<Option<&str>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(format!("metadata key {key} is {v:?}, not a string"))),
        }
    }

    /// The Qwen3 configuration the metadata describes. Another architecture, RoPE
    /// scaling, or keys that contradict each other are errors naming the key.
    pub fn config(&self) -> Result<Config> {
        let arch = self
            .str_key("general.architecture")?
            .ok_or_else(|| self.err("metadata key general.architecture is missing"))?;
        if arch != "qwen3" {
            return Err(self.err(format!(
                "general.architecture is {arch:?}; aisql runs qwen3 models"
            )));
        }
        let key = |k: &str| format!("qwen3.{k}");
        if let Some(kind) = self.str_key(&key("rope.scaling.type"))?
            && kind != "none"
        {
            return Err(self.err(format!(
                "qwen3.rope.scaling.type is {kind:?}; aisql runs unscaled RoPE"
            )));
        }
        let hidden = self.usize_key(&key("embedding_length"))?;
        let heads = self.usize_key(&key("attention.head_count"))?;
        let head_dim = match self.metadata.get(&key("attention.key_length")) {
            Some(_) => self.usize_key(&key("attention.key_length"))?,
            None if heads > 0 => hidden / heads,
            None => 0,
        };
        if let Some(v) = self.metadata.get(&key("attention.value_length"))
            && as_u64(v) != Some(head_dim as u64)
        {
            return Err(self.err(format!(
                "qwen3.attention.value_length {v:?} differs from key_length {head_dim}"
            )));
        }
        let embed = self.info("token_embd.weight")?;
        let vocab = match embed.dims.as_slice() {
            [v, h] if *h == hidden => *v,
            dims => {
                return Err(self.err(format!(
                    "tensor token_embd.weight has shape {dims:?}, expected [vocab, {hidden}] \
                     (qwen3.embedding_length)"
                )));
            }
        };
        let cfg = Config {
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: self.usize_key(&key("feed_forward_length"))?,
            num_hidden_layers: self.usize_key(&key("block_count"))?,
            num_attention_heads: heads,
            num_key_value_heads: self.usize_key(&key("attention.head_count_kv"))?,
            head_dim,
            rope_theta: self.f64_key(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            rms_norm_eps: self
                .f64_key(&key("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-6),
            tie_word_embeddings: !self.tensors.contains_key("output.weight"),
            attention_bias: self.tensors.contains_key("blk.0.attn_q.bias"),
            hidden_act: candle_nn::Activation::Silu,
            use_sliding_window: false,
            rope_scaling: None,
            max_position_embeddings: match self.metadata.get(&key("context_length")) {
                Some(_) => self.usize_key(&key("context_length"))?,
                None => 32_768,
            },
        };
        cfg.validate()
            .map_err(|e| self.err(format!("its qwen3.* metadata: {e}")))?;
        Ok(cfg)
    }

    fn info(&self, gguf_name: &str) -> Result<&TensorInfo> {
        self.tensors
            .get(gguf_name)
            .ok_or_else(|| self.err(format!("tensor {gguf_name} is missing")))
    }

    /// The block format the tensor Hugging Face calls `hf_name` is stored in, from
    /// the header (no data read); `None` when the file lacks it.
    pub fn stored_type(&self, hf_name: &str) -> Option<GgmlDType> {
        let name = gguf_name(hf_name)?;
        self.tensors.get(&name).map(|info| info.dtype)
    }

    /// The tensor Hugging Face calls `hf_name`, checked to have `shape` and
    /// finite scales (or values), in its stored block format on `device`.
    pub fn qtensor(&self, hf_name: &str, shape: &[usize], device: &Device) -> Result<QTensor> {
        let name = gguf_name(hf_name)
            .ok_or_else(|| self.err(format!("no GGUF name for tensor {hf_name}")))?;
        let info = self.info(&name)?;
        if info.dims != shape {
            return Err(self.err(format!(
                "tensor {name} has shape {:?}, but the metadata implies {shape:?}",
                info.dims
            )));
        }
        let bytes = &self.map[info.start..info.start + info.len];
        if let Some(why) = scales::non_finite_field(info.dtype, bytes) {
            return Err(self.err(format!("tensor {name}: {why}")));
        }
        qtensor_from_ggml(info.dtype, bytes, info.dims.clone(), device)
            .map_err(|e| self.err(format!("tensor {name}: {e}")))
    }

    /// [`Self::qtensor`] as float values (dequantized; finite, as its stored
    /// fields are).
    pub fn float(&self, hf_name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        let t = self
            .qtensor(hf_name, shape, &Device::Cpu)?
            .dequantize(&Device::Cpu)?;
        Ok(t.to_device(device)?)
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::U64(x) => Some(x),
        Value::I8(x) => u64::try_from(x).ok(),
        Value::I16(x) => u64::try_from(x).ok(),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}

type Parsed = (HashMap<String, Value>, HashMap<String, TensorInfo>);

fn parse(bytes: &[u8]) -> std::result::Result<Parsed, String> {
    let mut c = Cursor {
        bytes,
        pos: 0,
        items: 0,
    };
    let magic = c.u32("the magic number")?;
    if magic != MAGIC {
        return Err(format!("not a GGUF file (magic {magic:#010x})"));
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "GGUF version {version}; aisql reads versions 2 and 3"
        ));
    }
    let n_tensors = c.count("", "the tensor count", MIN_TENSOR_ENTRY_BYTES)?;
    let n_kv = c.count("", "the metadata count", MIN_METADATA_ENTRY_BYTES)?;
    let mut metadata = HashMap::new();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key #{i}"))?;
        let type_id = c.u32(&format!("the type of metadata key {key}"))?;
        let value = c.value(type_id, &format!("metadata key {key}"), 0)?;
        metadata.insert(key, value);
    }
    let mut raw = Vec::with_capacity(n_tensors.min(1 << 16));
    for i in 0..n_tensors {
        let name = c.string(&format!("the name of tensor #{i}"))?;
        let what = format!("tensor {name}");
        let n_dims = c.u32(&what)? as usize;
        if !(1..=4).contains(&n_dims) {
            return Err(format!("{what} has {n_dims} dimensions (1 to 4 allowed)"));
        }
        let mut dims = (0..n_dims)
            .map(|_| c.u64(&what).map(|d| d as usize))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        dims.reverse();
        let type_id = c.u32(&what)?;
        let dtype = match ggml_type(type_id) {
            Some(t) => t,
            None => {
                let name_of = unsupported_type_name(type_id).map_or_else(
                    || format!("unknown type {type_id}"),
                    |n| format!("{n} (type {type_id})"),
                );
                return Err(format!(
                    "{what} is stored as {name_of}, which aisql does not read \
                     (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K to Q6_K)"
                ));
            }
        };
        let offset = c.u64(&what)?;
        raw.push((name, dtype, dims, offset));
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match as_u64(v) {
            Some(a) if a.is_power_of_two() => a,
            _ => return Err(format!("general.alignment is {v:?}, not a power of two")),
        },
    };
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let mut tensors = HashMap::with_capacity(raw.len());
    for (name, dtype, dims, offset) in raw {
        let elems = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| format!("tensor {name} has shape {dims:?}, too large"))?;
        let (block, type_size) = (dtype.block_size(), dtype.type_size());
        let row = *dims.last().expect("at least one dimension");
        if !row.is_multiple_of(block) {
            return Err(format!(
                "tensor {name} has rows of {row} values, not a multiple of {dtype:?}'s block of {block}"
            ));
        }
        let len = (elems / block)
            .checked_mul(type_size)
            .ok_or_else(|| format!("tensor {name} has shape {dims:?}, too large"))?;
        let start = data_start
            .checked_add(offset)
            .filter(|s| {
                s.checked_add(len as u64)
                    .is_some_and(|e| e <= bytes.len() as u64)
            })
            .ok_or_else(|| {
                format!(
                    "truncated: tensor {name} ({dtype:?}, shape {dims:?}) needs bytes {}..{} \
                     but the file has {}",
                    data_start.saturating_add(offset),
                    data_start.saturating_add(offset).saturating_add(len as u64),
                    bytes.len()
                )
            })?;
        if tensors
            .insert(
                name.clone(),
                TensorInfo {
                    dtype,
                    dims,
                    start: start as usize,
                    len,
                },
            )
            .is_some()
        {
            return Err(format!("tensor {name} is listed twice"));
        }
    }
    Ok((metadata, tensors))
}

/// The GGUF (llama.cpp) name of the Hugging Face tensor `hf`, for the tensors of a
/// Qwen3.
pub fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    let part = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{part}.{kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_llama_cpp_names() {
        assert_eq!(
            gguf_name("model.layers.12.self_attn.k_norm.weight").as_deref(),
            Some("blk.12.attn_k_norm.weight")
        );
        assert_eq!(
            gguf_name("model.layers.0.mlp.down_proj.weight").as_deref(),
            Some("blk.0.ffn_down.weight")
        );
        assert_eq!(
            gguf_name("model.embed_tokens.weight").as_deref(),
            Some("token_embd.weight")
        );
        assert_eq!(gguf_name("model.layers.x.mlp.down_proj.weight"), None);
        assert_eq!(gguf_name("vision.patch.weight"), None);
    }

    /// A GGUF v3 header declaring `tensors` tensors and `entries` metadata
    /// entries, followed by `rest`.
    fn header(tensors: u64, entries: u64, rest: &[u8]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(tensors.to_le_bytes());
        b.extend(entries.to_le_bytes());
        b.extend_from_slice(rest);
        b
    }

    /// A metadata entry `key` of value type `type_id`, followed by `value`.
    fn entry(key: &str, type_id: u32, value: &[u8]) -> Vec<u8> {
        let mut b = (key.len() as u64).to_le_bytes().to_vec();
        b.extend(key.as_bytes());
        b.extend(type_id.to_le_bytes());
        b.extend_from_slice(value);
        b
    }

    /// An array value: item type, declared length, then `items`' bytes.
    fn array(item_type: u32, len: u64, items: &[u8]) -> Vec<u8> {
        let mut b = item_type.to_le_bytes().to_vec();
        b.extend(len.to_le_bytes());
        b.extend_from_slice(items);
        b
    }

    #[test]
    fn declared_counts_and_lengths_are_checked_before_anything_is_sized() {
        let padding = vec![0u8; 4096];
        let cases: Vec<(Vec<u8>, &str)> = vec![
            // 150 million u8 items declared, 4 KiB there.
            (
                header(
                    0,
                    1,
                    &entry("big", 9, &[array(0, 150_000_000, &padding)].concat()),
                ),
                "the array length of metadata key big is 150000000",
            ),
            // 2^40 strings: 8 bytes each at least.
            (
                header(
                    0,
                    1,
                    &entry("strs", 9, &[array(8, 1 << 40, &padding)].concat()),
                ),
                "the array length of metadata key strs is 1099511627776",
            ),
            // A string value of 2^50 bytes.
            (
                header(
                    0,
                    1,
                    &entry(
                        "name",
                        8,
                        &[(1u64 << 50).to_le_bytes().to_vec(), padding.clone()].concat(),
                    ),
                ),
                "the length of metadata key name is 1125899906842624",
            ),
            // A key of 2^62 bytes.
            (
                header(
                    0,
                    1,
                    &[(1u64 << 62).to_le_bytes().to_vec(), padding.clone()].concat(),
                ),
                "the length of metadata key #0 is 4611686018427387904",
            ),
            // 200 tensors of 32 bytes each at least do not fit in 4 KiB.
            (header(200, 0, &padding), "the tensor count is 200"),
            // 1000 entries of 13 bytes each at least do not fit either.
            (header(0, 1000, &padding), "the metadata count is 1000"),
        ];
        for (bytes, want) in cases {
            let e = parse(&bytes).unwrap_err();
            assert!(e.contains(want) && e.contains("bytes left"), "{e}");
        }
    }

    #[test]
    fn arrays_whose_items_would_not_fit_in_memory_are_refused_by_count() {
        // Every declared byte is there, but 5 million one-byte items would be
        // 5 million values of tens of bytes each: refused before reading one.
        let n = MAX_METADATA_ITEMS + 1;
        let bytes = header(
            0,
            1,
            &entry("tokens", 9, &array(0, n as u64, &vec![1u8; n])),
        );
        let e = parse(&bytes).unwrap_err();
        assert!(
            e.contains("metadata key tokens")
                && e.contains(&format!("more than the {MAX_METADATA_ITEMS}")),
            "{e}"
        );
        // The cap is on all arrays together.
        let half = MAX_METADATA_ITEMS / 2 + 1;
        let one = entry("a", 9, &array(0, half as u64, &vec![1u8; half]));
        let two = entry("b", 9, &array(0, half as u64, &vec![1u8; half]));
        let e = parse(&header(0, 2, &[one.clone(), two].concat())).unwrap_err();
        assert!(
            e.contains("metadata key b") && e.contains("more than the"),
            "{e}"
        );
        // Under the cap, such an array is read.
        let (metadata, _) = parse(&header(0, 1, &one)).unwrap();
        assert!(matches!(&metadata["a"], Value::Array(items) if items.len() == half));
    }

    #[test]
    fn a_tensor_whose_size_overflows_is_an_error() {
        let mut t = 4u64.to_le_bytes().to_vec();
        t.extend(b"huge");
        t.extend(2u32.to_le_bytes());
        t.extend(u64::MAX.to_le_bytes());
        t.extend(u64::MAX.to_le_bytes());
        t.extend(0u32.to_le_bytes()); // F32
        t.extend(0u64.to_le_bytes());
        let e = parse(&header(1, 0, &t)).unwrap_err();
        assert!(e.contains("tensor huge") && e.contains("too large"), "{e}");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [
            &b""[..],
            b"GGUF",
            b"GGUF\x03\x00\x00\x00",
            b"XXXX\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
            // version 3, one tensor, 2^60 metadata entries
            b"GGUF\x03\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10",
        ] {
            assert!(parse(bytes).is_err());
        }
    }
}
