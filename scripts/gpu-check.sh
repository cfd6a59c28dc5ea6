#!/usr/bin/env bash
# Runs the prebuilt GPU check (models/examples/gpu_check.rs) and prints/writes its JSON.
#
#   scripts/gpu-check.sh [--cpu] [--out FILE] [--device N] [--models 0.6b,4b] [--e2e]
#
# --e2e (after scripts/gpu-carry.sh --with-aisql) also runs `aisql bench` on the GPU
# over the carried end-to-end queries (tiny model, stand-in sf 0.01 generated on the
# spot) in f32 and bf16, and compares each with the carried CPU run
# (`aisql bench compare`: per predicate, the decisions that differ).
#
# On a GPU machine (no Rust, no network) it runs the CUDA binary
# $AISQL_GPU_CHECK_BIN (default .gpu-carry/gpu_check, built with
# scripts/gpu-carry.sh, which packs it with the kernels' GPU tests into .gpu-carry/).
# Missing CUDA runtime libraries (cudart, cublas, cublasLt, curand, nvrtc) are looked
# up in .gpu-carry/lib, $CUDA_HOME, /usr/local/cuda and Python's nvidia wheels.
# With --cpu it runs on the CPU, building the binary without `cuda` if no CPU
# build exists (needs cargo).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CARRY="${AISQL_GPU_CARRY:-$ROOT/.gpu-carry}"
CPU=0; OUT=""; PASS=(); E2E=0; DEVICE=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu) CPU=1; PASS+=(--cpu); shift ;;
    --out) OUT="$2"; shift 2 ;;
    --device) DEVICE="$2"; PASS+=("$1" "$2"); shift 2 ;;
    --models) PASS+=("$1" "$2"); shift 2 ;;
    --e2e) E2E=1; shift ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-$ROOT/target/gpu-check.json}"; mkdir -p "$(dirname "$OUT")"

if [[ $CPU == 1 ]]; then
  BIN="${AISQL_GPU_CHECK_BIN:-$ROOT/target/release/examples/gpu_check}"
  if [[ ! -x "$BIN" ]]; then
    echo "gpu-check.sh: building the CPU gpu_check ($BIN)" >&2
    (cd "$ROOT" && cargo build --release -p aisql-models --example gpu_check) || exit 1
  fi
else
  BIN="${AISQL_GPU_CHECK_BIN:-$CARRY/gpu_check}"
  # Carried binaries may come xz-compressed (the PTX inside compresses 7x).
  for z in "$CARRY"/*.xz; do
    [[ -f "$z" && ! -e "${z%.xz}" ]] || continue
    if command -v xz >/dev/null; then xz -dk "$z"; else
      python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$z" "${z%.xz}"; fi
    chmod +x "${z%.xz}"
  done
  [[ -x "$BIN" ]] || { echo "gpu-check.sh: no CUDA binary at $BIN (build it with --features cuda, see scripts/cuda-toolchain.sh)" >&2; exit 1; }
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader || true
  else
    echo "gpu-check.sh: nvidia-smi not found (no GPU driver?)" >&2
  fi
  # Library search path: carried libs first, then the machine's CUDA installs.
  DIRS=("$CARRY/lib")
  [[ -n "${CUDA_HOME:-}" ]] && DIRS+=("$CUDA_HOME/lib64" "$CUDA_HOME/lib")
  DIRS+=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu)
  for py in python3 /usr/bin/python3; do
    command -v "$py" >/dev/null || continue
    while read -r d; do DIRS+=("$d"); done < <("$py" - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + sys.path)
for r in roots:
    for d in glob.glob(os.path.join(r, "nvidia", "*", "lib")):
        print(d)
PY
)
  done
  LP=""
  for d in "${DIRS[@]}"; do [[ -d "$d" ]] && LP="$LP:$d"; done
  export LD_LIBRARY_PATH="${LP#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Libraries still missing: search the file system once for them.
  MISSING=$(ldd "$BIN" 2>&1 | awk '/not found/ && $1 ~ /^lib/ {print $1}' | sort -u)
  for lib in $MISSING; do
    f=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "$lib" -print 2>/dev/null | head -1)
    [[ -n "$f" ]] && export LD_LIBRARY_PATH="$(dirname "$f"):$LD_LIBRARY_PATH" && echo "gpu-check.sh: $lib from $(dirname "$f")" >&2
  done
  # Too old a libstdc++ on the machine: use the carried one.
  if ldd "$BIN" 2>&1 | grep -q "GLIBCXX.*not found" && [[ -d "$CARRY/compat" ]]; then
    export LD_LIBRARY_PATH="$CARRY/compat:$LD_LIBRARY_PATH"
  fi
  echo "gpu-check.sh: ldd:" >&2
  ldd "$BIN" 2>&1 | grep -E "cuda|cublas|curand|nvrtc|stdc|not found" >&2
fi

echo "gpu-check.sh: running $BIN ${PASS[*]:-}" >&2
"$BIN" "${PASS[@]}" --out "$OUT"
rc=$?
# GPU-vs-CPU kernel tests, when their (carried) test binary is there.
if [[ $CPU == 0 && -x "$CARRY/kernels_cuda_tests" ]]; then
  echo "gpu-check.sh: kernel tests ($CARRY/kernels_cuda_tests cuda_tests)" >&2
  "$CARRY/kernels_cuda_tests" cuda_tests --nocapture --test-threads=1 2>&1 | tee "${OUT%.json}-kernel-tests.log"
  trc=${PIPESTATUS[0]}
  [[ $trc == 0 ]] || { echo "gpu-check.sh: kernel tests failed (exit $trc)" >&2; [[ $rc == 0 ]] && rc=$trc; }
fi
# End to end: the engine on the GPU against the carried CPU run.
if [[ $E2E == 1 && $CPU == 0 ]]; then
  if [[ -x "$CARRY/aisql" && -f "$CARRY/e2e-queries" ]]; then
    Q=$(cat "$CARRY/e2e-queries"); E2E_DIR="$(dirname "$OUT")/e2e"
    rm -rf "$E2E_DIR"; mkdir -p "$E2E_DIR"
    for dt in f32 bf16; do
      echo "gpu-check.sh: aisql bench --gpu $DEVICE --dtype $dt --queries $Q" >&2
      "$CARRY/aisql" bench --sf 0.01 --queries "$Q" --gpu "$DEVICE" --dtype "$dt" \
        --output-dir "$E2E_DIR/gpu-$dt" 2>&1 | tail -n 25
      erc=${PIPESTATUS[0]}
      "$CARRY/aisql" bench compare "$CARRY/e2e-cpu-f32" "$E2E_DIR/gpu-$dt" --json "$E2E_DIR/compare-cpu-f32-vs-gpu-$dt.json" \
        > "$E2E_DIR/compare-cpu-f32-vs-gpu-$dt.md" 2>&1
      crc=$?
      echo "gpu-check.sh: e2e $dt: bench exit $erc, compare exit $crc ($E2E_DIR/compare-cpu-f32-vs-gpu-$dt.md)" >&2
      [[ $erc == 0 && $crc == 0 ]] || { [[ $rc == 0 ]] && rc=1; }
    done
  else
    echo "gpu-check.sh: --e2e needs the carried aisql (scripts/gpu-carry.sh --with-aisql)" >&2; [[ $rc == 0 ]] && rc=1
  fi
fi
[[ -f "$OUT" ]] && echo "gpu-check.sh: JSON written to $OUT (exit $rc)" >&2
exit $rc
