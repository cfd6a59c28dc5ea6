//! Checks of the kernels' CUDA path, in every build:
//! * GPU against CPU: each test prints why it skipped when no CUDA device can be
//!   opened (a CPU-only build, or a `cuda` build on a machine without a GPU), and
//!   otherwise compares every [`CudaKernels`] mode against the CPU kernels;
//! * the CUDA source itself under host emulation (`cuda/emulation/`), which needs
//!   only a C++20 compiler, so kernel changes are tested on machines without a GPU.

use candle_core::{DType, Device, Tensor};

use crate::attention::SeqKv;
use crate::testutil::{max_diff, randn};
use crate::{CudaKernels, set_cuda_kernels};

/// The kernel mode is process-wide; tests that switch it take turns.
static MODE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `check` under every [`CudaKernels`] mode in turn, then restores the default.
fn each_mode(mut check: impl FnMut(CudaKernels)) {
    let _turn = MODE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    for mode in [CudaKernels::Auto, CudaKernels::All, CudaKernels::Off] {
        set_cuda_kernels(mode);
        check(mode);
    }
    set_cuda_kernels(CudaKernels::Auto);
}

fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("skipped: no CUDA device 0 ({e})");
            None
        }
    }
}

/// Qwen3-4B attention shape: a 300-token document shared by three 40-token
/// questions, a 25-token suffix with no prefix, a two-segment prefix, and a
/// 2,000-token anchor under 24 15-token partners (large enough for cuBLAS in
/// `Auto`), packed in one call.
#[test]
fn shared_prefix_attention_gpu_matches_cpu() {
    let Some(dev) = gpu() else { return };
    let (h, kvh, d) = (32, 8, 128);
    let doc = (randn((kvh, 300, d), 1), randn((kvh, 300, d), 2));
    let question = (randn((kvh, 9, d), 10), randn((kvh, 9, d), 11));
    let anchor = (randn((kvh, 2000, d), 12), randn((kvh, 2000, d), 13));
    let mut plan: Vec<(usize, Vec<(Tensor, Tensor)>)> = vec![
        (40, vec![doc.clone()]),
        (40, vec![doc.clone()]),
        (40, vec![doc.clone()]),
        (25, vec![]),
        (15, vec![doc.clone(), question.clone()]),
    ];
    plan.extend((0..24).map(|_| (15, vec![anchor.clone()])));
    let total: usize = plan.iter().map(|p| p.0).sum();
    let (q, k, v) = (
        randn((h, total, d), 3),
        randn((kvh, total, d), 4),
        randn((kvh, total, d), 5),
    );
    let seqs_on = |dev: &Device, dt: DType| {
        let to = |t: &Tensor| t.to_device(dev).unwrap().to_dtype(dt).unwrap();
        SeqKv::packed(
            plan.iter()
                .map(|(len, prefix)| (*len, prefix.iter().map(|(a, b)| (to(a), to(b))).collect())),
        )
    };
    let scale = 1.0 / (d as f32).sqrt();
    let cpu = crate::prefix_suffix_attention(&q, &k, &v, &seqs_on(&Device::Cpu, DType::F32), scale)
        .unwrap();
    let to = |t: &Tensor, dt| t.to_device(&dev).unwrap().to_dtype(dt).unwrap();
    each_mode(|mode| {
        for (dt, tol) in [(DType::F32, 1e-4), (DType::BF16, 3e-2)] {
            let seqs = seqs_on(&dev, dt);
            let g =
                crate::prefix_suffix_attention(&to(&q, dt), &to(&k, dt), &to(&v, dt), &seqs, scale)
                    .unwrap();
            assert_eq!(g.dtype(), dt);
            let diff = max_diff(&cpu, &g);
            println!("attention {mode:?} {dt:?}: max |gpu - cpu| = {diff:.3e}");
            assert!(diff < tol, "{mode:?} {dt:?}: {diff}");
        }
    });
}

#[test]
fn restricted_head_gpu_matches_cpu() {
    let Some(dev) = gpu() else { return };
    let hidden = randn((1, 64, 1024), 6).squeeze(0).unwrap();
    let head = randn((1, 151_936, 1024), 7).squeeze(0).unwrap();
    let rows = [12u32, 345, 6789, 10111, 121, 3141, 51617, 151_935];
    let cpu = crate::restricted_head(&hidden, &head, &rows).unwrap();
    each_mode(|mode| {
        for (dt, tol) in [(DType::F32, 1e-3), (DType::BF16, 0.5)] {
            let g = crate::restricted_head(
                &hidden.to_device(&dev).unwrap().to_dtype(dt).unwrap(),
                &head.to_device(&dev).unwrap().to_dtype(dt).unwrap(),
                &rows,
            )
            .unwrap();
            let diff = max_diff(&cpu, &g);
            println!("restricted head {mode:?} {dt:?}: max |gpu - cpu| = {diff:.3e}");
            assert!(diff < tol, "{mode:?} {dt:?}: {diff}");
        }
    });
}

/// Compiles `cuda/aisql_kernels.cu` unchanged as host C++ (one thread per CUDA thread,
/// a barrier for `__syncthreads`) and runs every kernel case of
/// `cuda/emulation/harness.cpp` against its naive reference.
#[test]
fn cuda_source_matches_reference_under_host_emulation() {
    use std::process::Command;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/emulation");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let exe = std::env::temp_dir().join(format!("aisql-cuda-emulation-{}", std::process::id()));
    let build = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O1",
            "-pthread",
            "-Ishim",
            "harness.cpp",
            "-o",
        ])
        .arg(&exe)
        .current_dir(&dir)
        .output();
    let build = match build {
        Ok(out) => out,
        Err(e) => {
            println!("skipped: no C++ compiler {cxx:?} ({e})");
            return;
        }
    };
    assert!(
        build.status.success(),
        "{cxx} failed on cuda/emulation/harness.cpp:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let run = Command::new(&exe)
        .output()
        .expect("run the emulation harness");
    let _ = std::fs::remove_file(&exe);
    let report = String::from_utf8_lossy(&run.stdout);
    println!("{report}");
    assert!(
        run.status.success() && report.contains("failures: 0"),
        "CUDA kernels disagree with the reference under emulation:\n{report}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
}
