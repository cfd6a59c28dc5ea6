//! Finiteness of the float fields of GGML tensors as stored: the scales (and
//! mins) of each block of a quantized format, and every value of a float one.
//! A NaN or infinite scale would make every logit NaN; checking the stored
//! fields at load names the tensor and block instead, without dequantizing.

use candle_core::quantized::GgmlDType;
use half::{bf16, f16};

/// How a float field is stored.
#[derive(Debug, Clone, Copy)]
enum Float {
    F16,
    Bf16,
    F32,
}

impl Float {
    fn read(self, bytes: &[u8]) -> f32 {
        match self {
            Float::F16 => f16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
            Float::Bf16 => bf16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
            Float::F32 => f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        }
    }
}

/// The bytes of one block of `dtype` and where its float fields are (GGML's
/// `block_*` structs); a float format's "block" is one value.
fn float_fields(dtype: GgmlDType) -> (usize, &'static [(usize, Float, &'static str)]) {
    use Float::*;
    match dtype {
        GgmlDType::F32 => (4, &[(0, F32, "value")]),
        GgmlDType::F16 => (2, &[(0, F16, "value")]),
        GgmlDType::BF16 => (2, &[(0, Bf16, "value")]),
        GgmlDType::Q4_0 => (18, &[(0, F16, "scale")]),
        GgmlDType::Q4_1 => (20, &[(0, F16, "scale"), (2, F16, "min")]),
        GgmlDType::Q5_0 => (22, &[(0, F16, "scale")]),
        GgmlDType::Q5_1 => (24, &[(0, F16, "scale"), (2, F16, "min")]),
        GgmlDType::Q8_0 => (34, &[(0, F16, "scale")]),
        GgmlDType::Q8_1 => (36, &[(0, F16, "scale")]),
        GgmlDType::Q2K => (84, &[(80, F16, "scale"), (82, F16, "min")]),
        GgmlDType::Q3K => (110, &[(108, F16, "scale")]),
        GgmlDType::Q4K => (144, &[(0, F16, "scale"), (2, F16, "min")]),
        GgmlDType::Q5K => (176, &[(0, F16, "scale"), (2, F16, "min")]),
        GgmlDType::Q6K => (210, &[(208, F16, "scale")]),
        GgmlDType::Q8K => (292, &[(0, F32, "scale")]),
    }
}

/// The first float field of `bytes` (a tensor stored as `dtype`) that is NaN
/// or infinite, described ("block 3's scale is NaN"); `None` when all are finite.
pub(crate) fn non_finite_field(dtype: GgmlDType, bytes: &[u8]) -> Option<String> {
    let (size, fields) = float_fields(dtype);
    bytes.chunks_exact(size).enumerate().find_map(|(i, block)| {
        fields.iter().find_map(|&(offset, float, what)| {
            let v = float.read(&block[offset..]);
            (!v.is_finite()).then(|| match dtype {
                GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => format!("{what} {i} is {v}"),
                _ => format!("block {i}'s {what} is {v}"),
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{QTensor, ggml_file::qtensor_from_ggml};
    use candle_core::{Device, Tensor};

    use super::*;

    /// A 2×256 tensor stored as `dtype`, as bytes.
    fn stored(dtype: GgmlDType) -> Vec<u8> {
        let values: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let t = Tensor::from_vec(values, (2, 256), &Device::Cpu).unwrap();
        QTensor::quantize(&t, dtype)
            .unwrap()
            .data()
            .unwrap()
            .into_owned()
    }

    /// Whether candle's dequantization of `bytes` gives a value that is not finite.
    fn dequantizes_to_non_finite(dtype: GgmlDType, bytes: &[u8]) -> bool {
        let q = qtensor_from_ggml(dtype, bytes, vec![2, 256], &Device::Cpu).unwrap();
        let values: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        values.iter().any(|v| !v.is_finite())
    }

    const FORMATS: [GgmlDType; 13] = [
        GgmlDType::F32,
        GgmlDType::F16,
        GgmlDType::BF16,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q8_0,
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ];

    #[test]
    fn block_sizes_are_candles() {
        for dtype in FORMATS {
            assert_eq!(float_fields(dtype).0, dtype.type_size(), "{dtype:?}");
        }
    }

    #[test]
    fn quantized_weights_have_finite_fields() {
        for dtype in FORMATS {
            assert_eq!(non_finite_field(dtype, &stored(dtype)), None, "{dtype:?}");
        }
    }

    /// Each field the check reads is one candle's dequantization uses: made NaN
    /// (or infinite), the check names it and the dequantized values are not finite.
    #[test]
    fn each_field_checked_is_a_scale_candle_uses() {
        for dtype in FORMATS {
            let (size, fields) = float_fields(dtype);
            for &(offset, float, what) in fields {
                for bad in [f32::NAN, f32::INFINITY] {
                    let mut bytes = stored(dtype);
                    let second = size; // block (or value) 1
                    match float {
                        Float::F16 => bytes[second + offset..second + offset + 2]
                            .copy_from_slice(&f16::from_f32(bad).to_le_bytes()),
                        Float::Bf16 => bytes[second + offset..second + offset + 2]
                            .copy_from_slice(&bf16::from_f32(bad).to_le_bytes()),
                        Float::F32 => bytes[second + offset..second + offset + 4]
                            .copy_from_slice(&bad.to_le_bytes()),
                    }
                    let found = non_finite_field(dtype, &bytes);
                    let expected = match dtype {
                        GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                            format!("{what} 1 is {bad}")
                        }
                        _ => format!("block 1's {what} is {bad}"),
                    };
                    assert_eq!(found.as_deref(), Some(expected.as_str()), "{dtype:?}");
                    assert!(
                        dequantizes_to_non_finite(dtype, &bytes),
                        "{dtype:?}: the {what} at byte {offset} is not one candle reads"
                    );
                }
            }
        }
    }
}
