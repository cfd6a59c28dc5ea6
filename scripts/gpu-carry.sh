#!/usr/bin/env bash
# Builds the CUDA binaries that scripts/gpu-check.sh runs on a GPU machine (no Rust,
# no network there) and packs them into .gpu-carry/ (git-ignored):
#   gpu_check.xz           models/examples/gpu_check.rs, --features cuda
#   kernels_cuda_tests.xz  the kernels crate's unit tests, --features cuda
#   lib/libcudart.so.13    the CUDA runtime the binaries link
#   compat/libstdc++.so.6  this machine's libstdc++, for GPU machines with an older one
#
#   scripts/gpu-carry.sh                # needs scripts/cuda-toolchain.sh (run it first once)
#   scripts/gpu-carry.sh --with-aisql   # also the whole engine, for gpu-check.sh --e2e:
#     aisql.xz               the `aisql` binary, --features cuda (~30 MB packed)
#     e2e-queries            the queries of the end-to-end check
#     e2e-cpu-f32/           their bench run on this machine's CPU (tiny model, f32,
#                            stand-in sf 0.01), the reference the GPU run is compared to
#
# CARGO_TARGET_DIR defaults to target/cuda, so the CUDA build never disturbs the
# CPU one. A cold build takes about 21 minutes on 2 cores (mostly candle's kernels).
set -euo pipefail
WITH_AISQL=0
case "${1:-}" in
  --with-aisql) WITH_AISQL=1 ;;
  "") ;;
  *) echo "gpu-carry.sh: unknown argument $1" >&2; exit 2 ;;
esac
# Queries of the end-to-end check: a filter chain, self-joins under two aliases,
# classification of joined rows, three joins, an equality join, long reports and
# agent traces.
E2E_QUERIES=IMDB-1,IMDB-7,IMDB-8,IMDB-15,FEV-8,FEV-10,BIO-5,AGENT-1
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
if [[ $WITH_AISQL == 1 ]]; then
  # The QUAIL-B plans are built into the binary; AISQL_QUAILB_PLANS, when set, overrides
  # them in both runs below.
  cargo build --release --features cuda --bin aisql
  pack "$CARGO_TARGET_DIR/release/aisql" aisql
  rm -rf "$CARRY/plans" "$CARRY/e2e-cpu-f32"
  echo "$E2E_QUERIES" > "$CARRY/e2e-queries"
  # The CPU reference, with the default (CPU) build.
  (unset CARGO_TARGET_DIR; cargo run --quiet --bin aisql -- bench --sf 0.01 --queries "$E2E_QUERIES" \
     --cpu --dtype f32 --output-dir "$CARRY/e2e-cpu-f32")
fi
du -sh "$CARRY" >&2
