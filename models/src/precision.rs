//! What a model's projection weights are held in: a float dtype (the activations are
//! computed in it too) or a quantized block format of GGUF's (8-bit Q8_0, 4-bit Q4_K)
//! whose activations stay f32. The one parser of `--dtype`.

use std::str::FromStr;

use candle_core::DType;
use candle_core::quantized::GgmlDType;

use crate::{ModelError, Result};

/// The weights format asked for when loading safetensors (`--dtype`). Embeddings,
/// the output head and norms stay in float under a quantized format, as llama.cpp's
/// quantizer keeps norms and as the restricted TRUE/FALSE head needs exact rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// 32-bit floats.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
    /// GGUF's Q8_0: blocks of 32 signed bytes with one f16 scale (8.5 bits a weight).
    Q8_0,
    /// GGUF's Q4_K: super-blocks of 256 4-bit weights with 6-bit block scales and
    /// mins (4.5 bits a weight). A matrix whose rows are not a multiple of 256 long
    /// falls back to Q5_0, as llama.cpp's quantizer does.
    Q4K,
}

impl Precision {
    /// Every accepted spelling, for messages.
    pub const CHOICES: &'static str = "f32, bf16, f16, q8_0 or q4k";

    /// The name `--dtype` takes and run records show.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
            Self::Q4K => "q4k",
        }
    }

    /// The float precision of `dtype` (f32, bf16, f16), `None` for other dtypes.
    pub fn from_dtype(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F32 => Some(Self::F32),
            DType::BF16 => Some(Self::Bf16),
            DType::F16 => Some(Self::F16),
            _ => None,
        }
    }

    /// The dtype activations, the KV cache and float weights are computed in on
    /// `device`. On a CPU that is always f32: bf16 and f16 name the projection
    /// weights' format there (rounded to it at load), as Q8_0 and Q4_K do, because
    /// CPU elementwise ops on half-precision tensors widen every value to f32 and back
    /// on one thread, which made half precision slower than f32.
    pub fn compute_dtype(self, device: &candle_core::Device) -> DType {
        if device.is_cpu() {
            DType::F32
        } else {
            self.weight_dtype()
        }
    }

    /// The dtype float projection weights are stored in (rounded to at load).
    pub fn weight_dtype(self) -> DType {
        match self {
            Self::F32 | Self::Q8_0 | Self::Q4K => DType::F32,
            Self::Bf16 => DType::BF16,
            Self::F16 => DType::F16,
        }
    }

    /// The GGUF block format of a quantized precision, `None` for a float one.
    pub fn quantized(self) -> Option<GgmlDType> {
        match self {
            Self::Q8_0 => Some(GgmlDType::Q8_0),
            Self::Q4K => Some(GgmlDType::Q4K),
            Self::F32 | Self::Bf16 | Self::F16 => None,
        }
    }
}

impl FromStr for Precision {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" => Self::F32,
            "bf16" => Self::Bf16,
            "f16" => Self::F16,
            "q8_0" | "q8" => Self::Q8_0,
            "q4k" | "q4_k" => Self::Q4K,
            _ => {
                return Err(ModelError::Unsupported(format!(
                    "weights format {s:?} (use {})",
                    Self::CHOICES
                )));
            }
        })
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The block format a matrix with rows of `row_len` values is quantized to under
/// `wanted`: `wanted` when its blocks divide the row, else llama.cpp's fallback
/// (Q6_K → Q8_0, other 4- and 5-bit formats → Q5_0, then Q8_0), else `None` (the
/// matrix stays float).
pub(crate) fn block_format_for(wanted: GgmlDType, row_len: usize) -> Option<GgmlDType> {
    let fallback = match wanted {
        GgmlDType::Q6K => GgmlDType::Q8_0,
        _ => GgmlDType::Q5_0,
    };
    [wanted, fallback, GgmlDType::Q8_0]
        .into_iter()
        .find(|t| row_len.is_multiple_of(t.block_size()))
}

/// The lower-case name of a block format (`q8_0`, `q4k`, `q6k`, `f16`, …).
pub(crate) fn block_format_name(t: GgmlDType) -> String {
    format!("{t:?}").to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_name_and_rejects_others() {
        for p in [
            Precision::F32,
            Precision::Bf16,
            Precision::F16,
            Precision::Q8_0,
            Precision::Q4K,
        ] {
            assert_eq!(p.name().parse::<Precision>().unwrap(), p);
        }
        assert_eq!("Q4_K".parse::<Precision>().unwrap(), Precision::Q4K);
        let err = "int3".parse::<Precision>().unwrap_err().to_string();
        assert!(err.contains("int3") && err.contains("q8_0"), "{err}");
    }

    #[test]
    fn the_cpu_computes_in_f32_whatever_the_weights() {
        let cpu = candle_core::Device::Cpu;
        for p in [
            Precision::F32,
            Precision::Bf16,
            Precision::F16,
            Precision::Q8_0,
        ] {
            assert_eq!(p.compute_dtype(&cpu), DType::F32, "{p}");
        }
        assert_eq!(Precision::Q8_0.weight_dtype(), DType::F32);
        assert_eq!(Precision::Bf16.weight_dtype(), DType::BF16);
        assert_eq!(Precision::F16.weight_dtype(), DType::F16);
        assert_eq!(Precision::Bf16.quantized(), None);
    }

    #[test]
    fn rows_that_blocks_do_not_divide_fall_back() {
        assert_eq!(block_format_for(GgmlDType::Q4K, 1024), Some(GgmlDType::Q4K));
        assert_eq!(block_format_for(GgmlDType::Q4K, 64), Some(GgmlDType::Q5_0));
        assert_eq!(block_format_for(GgmlDType::Q8_0, 96), Some(GgmlDType::Q8_0));
        assert_eq!(block_format_for(GgmlDType::Q8_0, 20), None);
        assert_eq!(block_format_for(GgmlDType::Q6K, 64), Some(GgmlDType::Q8_0));
        assert_eq!(block_format_name(GgmlDType::Q4K), "q4k");
    }
}
