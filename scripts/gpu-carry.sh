#!/usr/bin/env bash
# Builds the CUDA binaries that scripts/gpu-check.sh runs on a GPU machine (no Rust,
# no network there) and packs them into .gpu-carry/ (git-ignored):
#   gpu_check.xz           models/examples/gpu_check.rs, --features cuda
#   kernels_cuda_tests.xz  the kernels crate's unit tests, --features cuda
#   lib/libcudart.so.13    the CUDA runtime the binaries link
#   compat/libstdc++.so.6  this machine's libstdc++, for GPU machines with an older one
#
#   scripts/gpu-carry.sh     # needs scripts/cuda-toolchain.sh (run it first once)
#
# CARGO_TARGET_DIR defaults to target/cuda, so the CUDA build never disturbs the
# CPU one. A cold build takes about 21 minutes on 2 cores (mostly candle's kernels).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CARRY="${AISQL_GPU_CARRY:-$ROOT/.gpu-carry}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target/cuda}"
eval "$("$ROOT/scripts/cuda-toolchain.sh" --env)"
[[ -x "$NVCC" ]] || { echo "gpu-carry.sh: no nvcc at $NVCC; run scripts/cuda-toolchain.sh first" >&2; exit 1; }
cd "$ROOT"
cargo build --release -p aisql-models --features cuda --example gpu_check
TESTS=$(cargo test --release -p aisql-kernels --features cuda --lib --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])' | tail -1)
[[ -x "$TESTS" ]] || { echo "gpu-carry.sh: kernels test binary not found" >&2; exit 1; }
mkdir -p "$CARRY/lib" "$CARRY/compat"
pack() {  # strip a copy and xz it to $CARRY/$2.xz
  local tmp; tmp=$(mktemp); cp "$1" "$tmp"; strip "$tmp"
  xz -T0 -6 -c "$tmp" > "$CARRY/$2.xz"; rm -f "$tmp" "$CARRY/$2"
  echo "gpu-carry.sh: $2.xz $(du -h "$CARRY/$2.xz" | cut -f1)" >&2
}
pack "$CARGO_TARGET_DIR/release/examples/gpu_check" gpu_check
pack "$TESTS" kernels_cuda_tests
cp -L "$CUDA_HOME/lib/libcudart.so.13" "$CARRY/lib/"
cp -L "$(g++ -print-file-name=libstdc++.so.6 2>/dev/null || echo /usr/lib/x86_64-linux-gnu/libstdc++.so.6)" "$CARRY/compat/libstdc++.so.6"
du -sh "$CARRY" >&2
