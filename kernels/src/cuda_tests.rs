//! GPU-against-CPU checks of the kernels' CUDA path (built with `--features cuda`).
//! Each test skips, printing why, when no CUDA device can be opened.

use candle_core::{DType, Device, Tensor};

use crate::attention::SeqKv;

fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("skipped: no CUDA device 0 ({e})");
            None
        }
    }
}

fn rand(shape: (usize, usize, usize), seed: u64) -> Tensor {
    let n = shape.0 * shape.1 * shape.2;
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15).wrapping_add(11);
    let data: Vec<f32> = (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a
        .to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let b = b
        .to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

#[test]
fn shared_prefix_attention_gpu_matches_cpu() {
    let Some(dev) = gpu() else { return };
    let (h, kvh, d) = (16, 8, 128);
    let doc = (rand((kvh, 300, d), 1), rand((kvh, 300, d), 2));
    let plan = [
        (40usize, true),
        (40, true),
        (40, true),
        (25, false),
        (15, true),
    ];
    let total: usize = plan.iter().map(|p| p.0).sum();
    let (q, k, v) = (
        rand((h, total, d), 3),
        rand((kvh, total, d), 4),
        rand((kvh, total, d), 5),
    );
    let seqs = |dev: &Device| {
        let doc = (doc.0.to_device(dev).unwrap(), doc.1.to_device(dev).unwrap());
        let mut start = 0;
        plan.iter()
            .map(|&(len, shared)| {
                let s = SeqKv {
                    prefix: if shared { vec![doc.clone()] } else { vec![] },
                    start,
                    len,
                };
                start += len;
                s
            })
            .collect::<Vec<_>>()
    };
    let cpu = crate::prefix_suffix_attention(&q, &k, &v, &seqs(&Device::Cpu), 0.088).unwrap();
    let to = |t: &Tensor, dt| t.to_device(&dev).unwrap().to_dtype(dt).unwrap();
    for (dt, tol) in [(DType::F32, 1e-4), (DType::BF16, 3e-2)] {
        let g = crate::prefix_suffix_attention(
            &to(&q, dt),
            &to(&k, dt),
            &to(&v, dt),
            &seqs(&dev)
                .iter()
                .map(|s| SeqKv {
                    prefix: s
                        .prefix
                        .iter()
                        .map(|(a, b)| (a.to_dtype(dt).unwrap(), b.to_dtype(dt).unwrap()))
                        .collect(),
                    start: s.start,
                    len: s.len,
                })
                .collect::<Vec<_>>(),
            0.088,
        )
        .unwrap();
        let diff = max_diff(&cpu, &g);
        println!("attention {dt:?}: max |gpu - cpu| = {diff:.3e}");
        assert!(diff < tol, "{dt:?}: {diff}");
    }
}

#[test]
fn restricted_head_gpu_matches_cpu() {
    let Some(dev) = gpu() else { return };
    let hidden = rand((1, 64, 1024), 6).squeeze(0).unwrap();
    let head = rand((1, 151_936, 1024), 7).squeeze(0).unwrap();
    let rows = [12u32, 345, 6789, 10111, 121, 3141, 51617, 151_935];
    let cpu = crate::restricted_head(&hidden, &head, &rows).unwrap();
    for (dt, tol) in [(DType::F32, 1e-3), (DType::BF16, 0.5)] {
        let g = crate::restricted_head(
            &hidden.to_device(&dev).unwrap().to_dtype(dt).unwrap(),
            &head.to_device(&dev).unwrap().to_dtype(dt).unwrap(),
            &rows,
        )
        .unwrap();
        let diff = max_diff(&cpu, &g);
        println!("restricted head {dt:?}: max |gpu - cpu| = {diff:.3e}");
        assert!(diff < tol, "{dt:?}: {diff}");
    }
}
