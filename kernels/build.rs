//! Compiles `cuda/aisql_kernels.cu` to PTX with nvcc when the `cuda` feature is on
//! (the CPU build needs no CUDA toolchain). nvcc is `$NVCC`, else
//! `$CUDA_HOME/bin/nvcc`, else `nvcc` on the PATH (`scripts/cuda-toolchain.sh`
//! installs one); the virtual architecture is `compute_$CUDA_COMPUTE_CAP`
//! (default 80, the oldest with bf16; the driver JIT-compiles it for newer GPUs).

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "cuda/aisql_kernels.cu";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    for var in ["NVCC", "CUDA_HOME", "CUDA_COMPUTE_CAP"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let nvcc = std::env::var_os("NVCC")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("bin/nvcc")))
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    let cap: String = cap.chars().filter(char::is_ascii_digit).collect();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("aisql_kernels.ptx");
    let status = Command::new(&nvcc)
        .args(["--ptx", "-O3", "--use_fast_math", "-std=c++17"])
        .arg(format!("-arch=compute_{cap}"))
        .arg("-o")
        .arg(&out)
        .arg(SOURCE)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{} failed ({s}) compiling {SOURCE}", nvcc.display()),
        Err(e) => panic!(
            "cannot run nvcc ({}): {e}; the `cuda` feature needs a CUDA compiler, \
             see scripts/cuda-toolchain.sh",
            nvcc.display()
        ),
    }
}
