//! A prefix's KV as bytes, for a store outside the process (the engine's
//! on-disk KV store): [`Qwen3::kv_to_bytes`] writes every position a handle
//! covers, its ancestors' included, and [`Qwen3::kv_from_bytes`] reads them
//! back as handles of this model on its device.
//!
//! The bytes say what they hold (layers, KV heads, head size, positions,
//! dtype, whether the last position's hidden state is there) and reading
//! checks every figure against the model and the length, so bytes of another
//! shape or dtype are refused, never read as KV. They carry no integrity
//! check of their own: whoever stores them checks them (a digest or a MAC)
//! before they get here.
//!
//! Layout, little endian: `b"AKV1"`, then u32 layers, u32 KV heads, u32 head
//! size, u32 positions, u32 hidden size, u8 dtype code (0 f32, 1 bf16, 2 f16),
//! u8 1 when the last hidden state follows; then per layer the keys and the
//! values, each `(heads, positions, head size)` row-major; then the hidden
//! state `(hidden,)`.

use candle_core::{DType, Tensor};

use crate::kv::{KvHandle, LayerKv, Segment};
use crate::{ModelError, Qwen3, Result};

const MAGIC: &[u8; 4] = b"AKV1";
const HEADER_BYTES: usize = 4 + 5 * 4 + 2;

fn dtype_code(dtype: DType) -> Result<u8> {
    match dtype {
        DType::F32 => Ok(0),
        DType::BF16 => Ok(1),
        DType::F16 => Ok(2),
        other => Err(ModelError::Unsupported(format!(
            "KV of dtype {other:?} cannot be stored"
        ))),
    }
}

fn code_dtype(code: u8) -> Option<DType> {
    match code {
        0 => Some(DType::F32),
        1 => Some(DType::BF16),
        2 => Some(DType::F16),
        _ => None,
    }
}

/// Appends `t`'s elements, row-major, as little-endian bytes.
fn put_tensor(out: &mut Vec<u8>, t: &Tensor) -> Result<()> {
    let flat = t.flatten_all()?;
    // One copy of the values into `out`: the bytes are the values' own on a
    // little-endian machine, the order the format fixes.
    match t.dtype() {
        DType::F32 => put_values(out, &flat.to_vec1::<f32>()?, f32::to_le_bytes),
        DType::BF16 => put_values(out, &flat.to_vec1::<half::bf16>()?, |v| {
            v.to_bits().to_le_bytes()
        }),
        DType::F16 => put_values(out, &flat.to_vec1::<half::f16>()?, |v| {
            v.to_bits().to_le_bytes()
        }),
        other => {
            return Err(ModelError::Unsupported(format!(
                "KV of dtype {other:?} cannot be stored"
            )));
        }
    }
    Ok(())
}

/// Appends `values` to `out` little-endian: one copy where that is their
/// layout in memory, value by value otherwise.
fn put_values<T: bytemuck::Pod, const N: usize>(
    out: &mut Vec<u8>,
    values: &[T],
    to_le: impl Fn(T) -> [u8; N],
) {
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(values));
    } else {
        out.reserve(values.len() * N);
        for &v in values {
            out.extend_from_slice(&to_le(v));
        }
    }
}

/// `bytes` (little-endian values) as a vector of `T`, whatever their
/// alignment.
fn take_values<T: bytemuck::Pod, const N: usize>(
    bytes: &[u8],
    from_le: impl Fn([u8; N]) -> T,
) -> Vec<T> {
    if cfg!(target_endian = "little") {
        bytemuck::pod_collect_to_vec(bytes)
    } else {
        bytes
            .chunks_exact(N)
            .map(|c| from_le(c.try_into().expect("N bytes")))
            .collect()
    }
}

fn take_tensor(bytes: &[u8], dtype: DType, shape: &[usize]) -> Result<Tensor> {
    let cpu = &candle_core::Device::Cpu;
    let t = match dtype {
        DType::F32 => Tensor::from_vec(take_values(bytes, f32::from_le_bytes), shape, cpu)?,
        DType::BF16 => Tensor::from_vec(
            take_values(bytes, |b| half::bf16::from_bits(u16::from_le_bytes(b))),
            shape,
            cpu,
        )?,
        _ => Tensor::from_vec(
            take_values(bytes, |b| half::f16::from_bits(u16::from_le_bytes(b))),
            shape,
            cpu,
        )?,
    };
    Ok(t)
}

fn bad(why: String) -> ModelError {
    ModelError::InvalidInput(format!("stored KV: {why}"))
}

impl Qwen3 {
    /// Every position `kv` covers, its ancestors' included, as bytes (the
    /// module's layout), with the last position's hidden state when the
    /// handle has one. Fails when a segment is offloaded or released.
    pub fn kv_to_bytes(&self, kv: &KvHandle) -> Result<Vec<u8>> {
        self.check_handle(kv)?;
        let chain = kv.chain()?;
        let cfg = self.config();
        let layers = cfg.num_hidden_layers;
        let last_hidden = chain.last().and_then(|s| s.last_hidden.clone());
        let mut out = Vec::with_capacity(HEADER_BYTES + kv.len() * self.kv_bytes_per_token());
        out.extend_from_slice(MAGIC);
        for v in [
            layers,
            cfg.num_key_value_heads,
            cfg.head_dim,
            kv.len(),
            cfg.hidden_size,
        ] {
            out.extend_from_slice(&(v as u32).to_le_bytes());
        }
        out.push(dtype_code(self.dtype())?);
        out.push(u8::from(last_hidden.is_some()));
        for layer in 0..layers {
            for side in 0..2 {
                let parts = chain
                    .iter()
                    .map(|s| {
                        let (k, v) = &s.layers[layer];
                        if side == 0 { k.clone() } else { v.clone() }
                    })
                    .collect::<Vec<_>>();
                let whole = Tensor::cat(&parts, 1)?;
                put_tensor(&mut out, &whole)?;
            }
        }
        if let Some(h) = &last_hidden {
            put_tensor(&mut out, &h.flatten_all()?)?;
        }
        Ok(out)
    }

    /// Handles of this model, on its device, for the stored positions
    /// `cuts[i]..cuts[i + 1]` of `bytes`, each continuing the one before and
    /// the first continuing `parent` (which covers `cuts[0]` positions, the
    /// stored ones it stands for: the caller knows they hold the same
    /// tokens). The last handle gets the stored hidden state, when there is
    /// one, so it can be scored; the others are views. Bytes of another
    /// shape, dtype or length, or cuts that do not fit them, are an error.
    pub fn kv_from_bytes(
        &self,
        parent: Option<&KvHandle>,
        bytes: &[u8],
        cuts: &[usize],
    ) -> Result<Vec<KvHandle>> {
        if let Some(p) = parent {
            self.check_handle(p)?;
        }
        let cfg = self.config();
        if bytes.len() < HEADER_BYTES || &bytes[..4] != MAGIC {
            return Err(bad("not aisql KV bytes (no AKV1 header)".into()));
        }
        let field = |i: usize| {
            u32::from_le_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize
        };
        let (layers, heads, head_dim, len, hidden) =
            (field(0), field(1), field(2), field(3), field(4));
        let want = (
            cfg.num_hidden_layers,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.hidden_size,
        );
        if (layers, heads, head_dim, hidden) != want {
            return Err(bad(format!(
                "shape (layers, KV heads, head size, hidden) {:?}, this model's is {want:?}",
                (layers, heads, head_dim, hidden)
            )));
        }
        let dtype = code_dtype(bytes[24])
            .ok_or_else(|| bad(format!("dtype code {} is none aisql writes", bytes[24])))?;
        if dtype != self.dtype() {
            return Err(bad(format!(
                "dtype {dtype:?}, this model's KV is {:?}",
                self.dtype()
            )));
        }
        let has_hidden = match bytes[25] {
            0 => false,
            1 => true,
            other => return Err(bad(format!("hidden-state flag {other}"))),
        };
        let size = dtype.size_in_bytes();
        let side = heads * len * head_dim * size;
        let expected = HEADER_BYTES + layers * 2 * side + usize::from(has_hidden) * hidden * size;
        if bytes.len() != expected {
            return Err(bad(format!(
                "{} bytes, {expected} for {len} positions",
                bytes.len()
            )));
        }
        let ordered = cuts.windows(2).all(|w| w[0] < w[1]);
        if cuts.len() < 2 || !ordered || cuts[cuts.len() - 1] != len {
            return Err(bad(format!(
                "positions {cuts:?} do not cut {len} stored positions"
            )));
        }
        let start = parent.map_or(0, KvHandle::len);
        if start != cuts[0] {
            return Err(bad(format!(
                "the first cut is at {}, the prefix it continues covers {start}",
                cuts[0]
            )));
        }
        let device = self.device();
        let mut whole: Vec<LayerKv> = Vec::with_capacity(layers);
        let mut at = HEADER_BYTES;
        for _ in 0..layers {
            let k = take_tensor(&bytes[at..at + side], dtype, &[heads, len, head_dim])?;
            at += side;
            let v = take_tensor(&bytes[at..at + side], dtype, &[heads, len, head_dim])?;
            at += side;
            whole.push((k, v));
        }
        let last_hidden = if has_hidden {
            Some(take_tensor(&bytes[at..], dtype, &[hidden])?.to_device(device)?)
        } else {
            None
        };
        let mut out: Vec<KvHandle> = Vec::with_capacity(cuts.len() - 1);
        let mut prev = parent.cloned();
        for (i, w) in cuts.windows(2).enumerate() {
            let (from, n) = (w[0], w[1] - w[0]);
            let layers = whole
                .iter()
                .map(|(k, v)| {
                    Ok((
                        k.narrow(1, from, n)?.contiguous()?.to_device(device)?,
                        v.narrow(1, from, n)?.contiguous()?.to_device(device)?,
                    ))
                })
                .collect::<Result<Vec<LayerKv>>>()?;
            let is_last = i + 2 == cuts.len();
            let segment = Segment {
                layers: std::sync::Arc::new(layers),
                last_hidden: if is_last { last_hidden.clone() } else { None },
            };
            let h = self.new_handle(prev.clone(), segment);
            prev = Some(h.clone());
            out.push(h);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::{max_abs_diff, tiny_dir};
    use crate::{Continuation, Qwen3};

    #[test]
    fn stored_kv_continues_and_scores_as_the_computed_kv() {
        let model = Qwen3::load_for_test(tiny_dir());
        let tokens: Vec<u32> = (1..40).collect();
        let kv = model.prefill(None, &tokens).unwrap();
        let bytes = model.kv_to_bytes(&kv).unwrap();
        assert_eq!(
            bytes.len(),
            super::HEADER_BYTES
                + tokens.len() * model.kv_bytes_per_token()
                + model.config().hidden_size * 4
        );
        // Read back in two pieces on a computed start of 10 positions.
        let start = model.prefill(None, &tokens[..10]).unwrap();
        let back = model
            .kv_from_bytes(Some(&start), &bytes, &[10, 25, 39])
            .unwrap();
        assert_eq!(back[1].len(), 39);
        assert_eq!(back[0].segment_len(), 15);
        let next = [7u32, 8, 9];
        let logits = |kv| {
            model
                .logits(&[Continuation::new(Some(kv), &next)])
                .unwrap()
                .remove(0)
        };
        assert!(max_abs_diff(&logits(&kv), &logits(&back[1])) < 1e-5);
        // The middle piece is a view: bytes of its own last position were not kept.
        assert_eq!(
            model.kv_to_bytes(&back[0]).unwrap()[25],
            0,
            "a view has no hidden state"
        );
    }

    #[test]
    fn bytes_of_another_shape_length_or_cut_are_refused() {
        let model = Qwen3::load_for_test(tiny_dir());
        let kv = model.prefill(None, &[1, 2, 3, 4, 5]).unwrap();
        let bytes = model.kv_to_bytes(&kv).unwrap();
        let err = |b: &[u8], cuts: &[usize]| {
            model
                .kv_from_bytes(None, b, cuts)
                .map(|h| h.len())
                .expect_err("refused")
                .to_string()
        };
        assert!(err(&bytes[..bytes.len() - 1], &[0, 5]).contains("bytes"));
        assert!(err(b"nope", &[0, 5]).contains("header"));
        let mut layers = bytes.clone();
        layers[4] ^= 1;
        assert!(err(&layers, &[0, 5]).contains("shape"));
        let mut dtype = bytes.clone();
        dtype[24] = 1;
        assert!(err(&dtype, &[0, 5]).contains("dtype"));
        assert!(err(&bytes, &[0, 4]).contains("cut"));
        assert!(err(&bytes, &[0, 3, 3, 5]).contains("cut"));
        assert!(err(&bytes, &[1, 5]).contains("first cut"));
    }
}
