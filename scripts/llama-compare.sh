#!/usr/bin/env bash
# Compares aisql's CPU prefill (prompt processing) and decoding speed with llama.cpp's
# on the same random model, interleaved, every measurement in a fresh process.
#
#   scripts/llama-compare.sh [--aisql PATH] [--work DIR] [--rounds N] [--threads N]
#                            [--shape qwen3-0.6b] [--cases LIST] [--systems LIST]
#                            [--llama-batch N] [--python PATH]
#
#   --aisql PATH     aisql binary (default target/release/aisql; cargo build --release)
#   --work DIR       models, node-llama-cpp and results (default ~/.cache/aisql/llama-compare)
#   --rounds N       measurements per case and system (default 5); medians are reported
#   --threads N      CPU threads for both engines (default 2): RAYON_NUM_THREADS for
#                    aisql, node-llama-cpp's threads for llama.cpp
#   --shape NAME     model shape for `aisql model random` (default and only: qwen3-0.6b)
#   --cases LIST     PxS,... prompt tokens x sequences (default 300x1,300x16,2048x1);
#                    PxS+D decodes instead: D tokens for each of S sequences after one
#                    shared P-token prompt (e.g. 300x1+64 is llama-bench's tg 64 at
#                    depth 300; 300x16+32 is 16 parallel sequences over one prompt)
#   --systems LIST   default aisql-f32,aisql-bf16,aisql-q8_0,aisql-q4k,llama-f16,llama-q8_0,llama-q4_k_m;
#                    also numpy-sgemm: the f32 GEMM bar (numpy's sgemm on the prefill's
#                    projection GEMMs alone, scripts/llama-compare/sgemm.py), for aisql-f32
#   --llama-batch N  llama.cpp batch size (n_batch = n_ubatch); default min(P*S, 4096)
#   --python PATH    python with numpy for numpy-sgemm (default: the test venv's,
#                    ~/.cache/aisql-test-venv, made by scripts/test-tools.sh; else python3)
#
# Once per WORK it installs node-llama-cpp 3.21.1 (scripts/llama-compare/package.json;
# npm, prebuilt llama.cpp CPU binaries, never a source build) into WORK/node, and makes
# the models: `aisql model random --shape SHAPE --seed 0` -> WORK/model-f32, and
# `aisql model gguf` -> WORK/model-F16.gguf, model-Q8_0.gguf, model-Q4_K_M.gguf.
# Then, for each round, case and system in order, it runs one measurement:
#   aisql-f32/bf16/q8_0/q4k: RAYON_NUM_THREADS=N aisql model bench --model M [--dtype bf16]
#                            --prompt-tokens P --sequences S [--decode-tokens D] --rounds 1
#                            --format json
#   llama-f16/q8_0/q4_k_m:   node scripts/llama-compare/llama-bench.mjs --model WORK/model-X.gguf
#                            --threads N --prompt-tokens P --sequences S [--decode-tokens D]
#                            --rounds 1
#   numpy-sgemm:             OPENBLAS_NUM_THREADS=N python scripts/llama-compare/sgemm.py
#                            --prompt-tokens P --sequences S --rounds 1
# Both print JSON lines (prompt_tokens, sequences, tokens, wall_s, cpu_s, tokens_per_s)
# for the measured forward (or the D decoding steps) only, after an uncounted warm-up;
# loading, and for decoding the shared prompt, are not counted. aisql caches the shared
# prompt once and every sequence reads it; llama.cpp holds a copy in each sequence.
# Prints machine facts and a table of medians (tokens/s, CPU s per 1k tokens, CPU
# util = cpu_s/wall_s); writes the raw lines (tagged with system, case, round) to
# WORK/results.jsonl and the facts and table to WORK/results.md.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
HELPERS="$ROOT/scripts/llama-compare"
NODE_LLAMA_CPP_VERSION="3.21.1"

AISQL="$ROOT/target/release/aisql"
WORK="${HOME}/.cache/aisql/llama-compare"
ROUNDS=5
THREADS=2
SHAPE="qwen3-0.6b"
CASES="300x1,300x16,2048x1"
SYSTEMS="aisql-f32,aisql-bf16,aisql-q8_0,aisql-q4k,llama-f16,llama-q8_0,llama-q4_k_m"
LLAMA_BATCH=0
PYTHON=""

die() { echo "llama-compare: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo pipefail$/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || { echo "llama-compare: $1 needs a value" >&2; exit 2; }; }
positive_int() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || { echo "llama-compare: $1 wants a positive integer, not '$2'" >&2; exit 2; }; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --aisql) need_value "$@"; AISQL="$2"; shift 2 ;;
    --work) need_value "$@"; WORK="$2"; shift 2 ;;
    --rounds) need_value "$@"; positive_int "$1" "$2"; ROUNDS="$2"; shift 2 ;;
    --threads) need_value "$@"; positive_int "$1" "$2"; THREADS="$2"; shift 2 ;;
    --shape) need_value "$@"; SHAPE="$2"; shift 2 ;;
    --cases) need_value "$@"; CASES="$2"; shift 2 ;;
    --systems) need_value "$@"; SYSTEMS="$2"; shift 2 ;;
    --llama-batch) need_value "$@"; positive_int "$1" "$2"; LLAMA_BATCH="$2"; shift 2 ;;
    --python) need_value "$@"; PYTHON="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "llama-compare: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

case "$SHAPE" in
  qwen3-0.6b) ;;
  *) echo "llama-compare: --shape $SHAPE: only qwen3-0.6b is supported" >&2; exit 2 ;;
esac

IFS=',' read -r -a CASE_LIST <<< "$CASES"
IFS=',' read -r -a SYSTEM_LIST <<< "$SYSTEMS"
[[ ${#CASE_LIST[@]} -gt 0 ]] || { echo "llama-compare: --cases is empty" >&2; exit 2; }
[[ ${#SYSTEM_LIST[@]} -gt 0 ]] || { echo "llama-compare: --systems is empty" >&2; exit 2; }
for c in "${CASE_LIST[@]}"; do
  [[ "$c" =~ ^[1-9][0-9]*x[1-9][0-9]*(\+[1-9][0-9]*)?$ ]] \
    || { echo "llama-compare: case '$c' is not PROMPT_TOKENSxSEQUENCES[+DECODED] (e.g. 300x16 or 300x16+32)" >&2; exit 2; }
done

# System -> model file (relative to WORK) and extra aisql flags.
NEED_AISQL_RUN=0; NEED_LLAMA=0; NEED_NUMPY=0
model_of() {
  case "$1" in
    aisql-f32|aisql-bf16|numpy-sgemm) echo "model-f32" ;;
    aisql-q8_0|llama-q8_0) echo "model-Q8_0.gguf" ;;
    aisql-q4k|llama-q4_k_m) echo "model-Q4_K_M.gguf" ;;
    llama-f16) echo "model-F16.gguf" ;;
    *) return 1 ;;
  esac
}
for s in "${SYSTEM_LIST[@]}"; do
  model_of "$s" >/dev/null || { echo "llama-compare: unknown system '$s' (known: aisql-f32, aisql-bf16, aisql-q8_0, aisql-q4k, llama-f16, llama-q8_0, llama-q4_k_m, numpy-sgemm)" >&2; exit 2; }
  case "$s" in aisql-*) NEED_AISQL_RUN=1 ;; llama-*) NEED_LLAMA=1 ;; numpy-*) NEED_NUMPY=1 ;; esac
done

mkdir -p "$WORK" || die "cannot create the work folder $WORK"
WORK="$(cd "$WORK" && pwd)"
[[ "$AISQL" == /* ]] || AISQL="$PWD/$AISQL"

command -v node >/dev/null || die "node (>= 20) is needed for node-llama-cpp and the report; none on PATH"
NODE_MAJOR="$(node -p 'process.versions.node.split(".")[0]')"
[[ "$NODE_MAJOR" -ge 20 ]] || die "node $(node --version) is too old: node-llama-cpp $NODE_LLAMA_CPP_VERSION needs node >= 20"

require_aisql() {
  [[ -x "$AISQL" ]] || die "no aisql binary at $AISQL: build it with 'cargo build --release' in $ROOT, or pass --aisql PATH"
}

[[ $NEED_AISQL_RUN == 0 ]] || require_aisql

if [[ $NEED_NUMPY == 1 ]]; then
  if [[ -z "$PYTHON" ]]; then
    PYTHON="${AISQL_TEST_VENV:-$HOME/.cache/aisql-test-venv}/bin/python"
    [[ -x "$PYTHON" ]] || PYTHON="python3"
  fi
  NUMPY_VERSION="$("$PYTHON" -c 'import numpy; print(numpy.__version__)' 2>/dev/null)" \
    || die "numpy-sgemm needs a python with numpy: $PYTHON has none (run scripts/test-tools.sh, or pass --python PATH)"
fi

# ---- node-llama-cpp ---------------------------------------------------------------
NODE_DIR="$WORK/node"
installed_version() {
  node -e 'try { process.stdout.write(require(process.argv[1]).version) } catch { }' \
    "$NODE_DIR/node_modules/node-llama-cpp/package.json"
}
prebuilt_package() {
  case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) echo "@node-llama-cpp/linux-x64" ;;
    Linux-aarch64|Linux-arm64) echo "@node-llama-cpp/linux-arm64" ;;
    Darwin-arm64) echo "@node-llama-cpp/mac-arm64-metal" ;;
    Darwin-x86_64) echo "@node-llama-cpp/mac-x64" ;;
    *) return 1 ;;
  esac
}
if [[ $NEED_LLAMA == 1 ]]; then
  PREBUILT="$(prebuilt_package)" \
    || die "no prebuilt node-llama-cpp CPU binary for $(uname -s) $(uname -m) (this script never builds llama.cpp from source)"
  if [[ "$(installed_version)" != "$NODE_LLAMA_CPP_VERSION" || ! -d "$NODE_DIR/node_modules/$PREBUILT" ]]; then
    command -v npm >/dev/null || die "npm is needed to install node-llama-cpp $NODE_LLAMA_CPP_VERSION; none on PATH"
    echo "llama-compare: installing node-llama-cpp $NODE_LLAMA_CPP_VERSION and $PREBUILT into $NODE_DIR" >&2
    mkdir -p "$NODE_DIR"
    cp "$HELPERS/package.json" "$NODE_DIR/package.json"
    # --omit=optional skips the other platforms' and the GPU binaries (~650 MB); the
    # CPU one is named. --ignore-scripts and NODE_LLAMA_CPP_SKIP_DOWNLOAD: no postinstall
    # that could download and compile llama.cpp.
    if ! NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --prefix "$NODE_DIR" --omit=optional \
        --ignore-scripts --no-audit --no-fund --no-save "$PREBUILT@$NODE_LLAMA_CPP_VERSION" >&2; then
      die "npm install of node-llama-cpp $NODE_LLAMA_CPP_VERSION into $NODE_DIR failed (see npm's output above; is the npm registry reachable?)"
    fi
    [[ "$(installed_version)" == "$NODE_LLAMA_CPP_VERSION" ]] \
      || die "npm install finished but $NODE_DIR has no node-llama-cpp $NODE_LLAMA_CPP_VERSION"
  fi
  LLAMA_INFO="$(node "$HELPERS/llama-bench.mjs" --info --node-dir "$NODE_DIR" 2>"$WORK/llama-info.stderr")" \
    || { cat "$WORK/llama-info.stderr" >&2; die "node-llama-cpp $NODE_LLAMA_CPP_VERSION could not load its prebuilt llama.cpp CPU binary (no source build is attempted)"; }
fi

# ---- models -----------------------------------------------------------------------
SHAPE_FILE="$WORK/model-f32/.llama-compare-shape"
if [[ -f "$SHAPE_FILE" && "$(cat "$SHAPE_FILE")" != "$SHAPE" ]]; then
  die "$WORK holds models of shape $(cat "$SHAPE_FILE"), not $SHAPE: use another --work"
fi
NEEDED_MODELS=()
for s in "${SYSTEM_LIST[@]}"; do NEEDED_MODELS+=("$(model_of "$s")"); done
need_model() { local m; for m in "${NEEDED_MODELS[@]}"; do [[ "$m" == "$1" ]] && return 0; done; return 1; }

run_logged() {  # run_logged WHAT CMD...: run, and on failure print its output and stop
  local what="$1"; shift
  local log="$WORK/last-command.log"
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    die "$what failed: $*"
  fi
}
if [[ ! -f "$WORK/model-f32/model.safetensors" || ! -f "$WORK/model-f32/config.json" ]]; then
  require_aisql
  echo "llama-compare: making the random $SHAPE model (f32) in $WORK/model-f32" >&2
  rm -rf "$WORK/model-f32.partial"
  run_logged "making the random model" "$AISQL" model random --shape "$SHAPE" --out "$WORK/model-f32.partial" --seed 0
  rm -rf "$WORK/model-f32"
  mv "$WORK/model-f32.partial" "$WORK/model-f32"
  echo "$SHAPE" > "$SHAPE_FILE"
fi
for pair in F16:f16 Q8_0:q8_0 Q4_K_M:q4_k_m; do
  name="model-${pair%%:*}.gguf"; type="${pair#*:}"
  need_model "$name" || continue
  [[ -f "$WORK/$name" ]] && continue
  require_aisql
  echo "llama-compare: writing $WORK/$name (aisql model gguf --type $type)" >&2
  partial="$WORK/${name%.gguf}.partial.gguf"
  rm -f "$partial"
  run_logged "writing $name" "$AISQL" model gguf --model "$WORK/model-f32" --out "$partial" --type "$type"
  mv "$partial" "$WORK/$name"
done

# ---- machine facts ----------------------------------------------------------------
CPU_MODEL="$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/^[^:]*: *//' || true)"
FACTS=(
  "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  "host: $(uname -srm)"
  "cpu: ${CPU_MODEL:-unknown}"
  "cores: $(nproc 2>/dev/null || echo '?') online ($(getconf _NPROCESSORS_CONF 2>/dev/null || echo '?') configured)"
  "threads: $THREADS, rounds: $ROUNDS, shape: $SHAPE"
)
if [[ -x "$AISQL" ]]; then
  FACTS+=("aisql: $("$AISQL" --version 2>&1 | head -n 1) ($AISQL)")
fi
FACTS+=("node: $(node --version)")
if [[ $NEED_NUMPY == 1 ]]; then
  FACTS+=("numpy-sgemm: numpy $NUMPY_VERSION ($PYTHON), the projection GEMMs of one prefill only (scripts/llama-compare/sgemm.py)")
fi
if [[ $NEED_LLAMA == 1 ]]; then
  # shellcheck disable=SC2016 # the single-quoted text is JavaScript
  mapfile -t LLAMA_FACTS < <(node -e '
    const i = JSON.parse(process.argv[1]);
    const cpu = (i.loaded_ggml_libraries || []).filter((l) => /ggml-cpu/.test(l)).join(" ") || "?";
    console.log(`llama.cpp: node-llama-cpp ${i.node_llama_cpp} (llama.cpp release ${i.llama_cpp_release}), ` +
      `${i.build_type} binary, gpu ${i.gpu}, cpuMathCores ${i.cpu_math_cores}, CPU backend ${cpu}`);
    console.log(`llama.cpp system info: ${i.system_info.trim()}`);' "$LLAMA_INFO")
  FACTS+=("${LLAMA_FACTS[@]}")
  if [[ $LLAMA_BATCH -gt 0 ]]; then LB="$LLAMA_BATCH"; else LB="min(P*S, 4096)"; fi
  FACTS+=("llama.cpp settings: gpu false, gpuLayers 0, batchSize $LB (n_batch = n_ubatch), context per sequence P+D+64 rounded up to 256, flash attention auto, KV cache f16; prefill without logits (evaluateWithoutGeneratingNewTokens), decoding greedy (evaluate, temperature 0)")
fi
printf '%s\n' "${FACTS[@]}"
echo

# ---- measurements -----------------------------------------------------------------
RESULTS="$WORK/results.jsonl"
: > "$RESULTS"
OUT_FILE="$WORK/measure.stdout"; ERR_FILE="$WORK/measure.stderr"

measure() {  # measure ROUND CASE SYSTEM
  local round="$1" case="$2" system="$3" p="${2%%x*}" rest="${2#*x}" model cmd=()
  local s="${rest%%+*}" d=0
  [[ "$rest" == *+* ]] && d="${rest#*+}"
  model="$WORK/$(model_of "$system")"
  case "$system" in
    aisql-*)
      cmd=(env "RAYON_NUM_THREADS=$THREADS" "$AISQL" model bench --model "$model")
      if [[ "$system" == aisql-bf16 ]]; then cmd+=(--dtype bf16); fi
      cmd+=(--prompt-tokens "$p" --sequences "$s" --decode-tokens "$d" --rounds 1 --format json) ;;
    llama-*)
      cmd=(node "$HELPERS/llama-bench.mjs" --node-dir "$NODE_DIR" --model "$model" --threads "$THREADS"
           --prompt-tokens "$p" --sequences "$s" --decode-tokens "$d" --rounds 1)
      if [[ $LLAMA_BATCH -gt 0 ]]; then cmd+=(--batch-size "$LLAMA_BATCH"); fi ;;
    numpy-*)
      [[ $d == 0 ]] || { echo "llama-compare: numpy-sgemm measures prefill GEMMs only, not decoding case $case" >&2; exit 2; }
      cmd=(env "OPENBLAS_NUM_THREADS=$THREADS" "$PYTHON" "$HELPERS/sgemm.py"
           --prompt-tokens "$p" --sequences "$s" --rounds 1) ;;
  esac
  local rc=0
  "${cmd[@]}" >"$OUT_FILE" 2>"$ERR_FILE" || rc=$?
  local lines=0 line tps=""
  if [[ $rc == 0 ]]; then
    while IFS= read -r line; do
      [[ "$line" == \{*\} ]] || continue
      printf '{"system":"%s","case":"%s","round":%d,%s\n' "$system" "$case" "$round" "${line#\{}" >> "$RESULTS"
      lines=$((lines + 1))
      tps="$(node -p 'Math.round(JSON.parse(process.argv[1]).tokens_per_s)' "$line" 2>/dev/null || echo '?')"
    done < "$OUT_FILE"
  fi
  if [[ $rc != 0 || $lines == 0 ]]; then
    {
      echo "llama-compare: measurement failed: system $system, case $case (prompt tokens $p, sequences $s), round $round"
      if [[ $rc != 0 ]]; then echo "  exit status $rc"; else echo "  it printed no JSON line"; fi
      echo "  command: ${cmd[*]}"
      echo "  --- stderr ---"; sed 's/^/  /' "$ERR_FILE"
      echo "  --- stdout ---"; sed 's/^/  /' "$OUT_FILE"
    } >&2
    exit 1
  fi
  printf 'llama-compare: round %d/%d  %-8s %-14s %8s tokens/s\n' "$round" "$ROUNDS" "$case" "$system" "$tps" >&2
}

for ((round = 1; round <= ROUNDS; round++)); do
  for c in "${CASE_LIST[@]}"; do
    for s in "${SYSTEM_LIST[@]}"; do
      measure "$round" "$c" "$s"
    done
  done
done
rm -f "$OUT_FILE" "$ERR_FILE"

# ---- report -----------------------------------------------------------------------
TABLE="$(node "$HELPERS/report.mjs" "$RESULTS")"
{
  echo "# aisql vs llama.cpp: CPU prefill and decoding"
  echo
  printf -- '- %s\n' "${FACTS[@]}"
  echo
  echo "Medians over rounds; CPU util = cpu_s / wall_s; every measurement a fresh process, interleaved by round."
  echo
  echo "$TABLE"
} > "$WORK/results.md"
echo "$TABLE"
echo
echo "llama-compare: raw results in $RESULTS, table in $WORK/results.md" >&2
