#!/usr/bin/env bash
# Checks that this repository stands on its own: clones its HEAD (committed work
# only) into an empty temporary folder with nothing beside it, builds it, runs the
# README's quick bench from a third folder (stand-in data, tiny model, CPU) and one
# test binary. Nothing outside the clone is read: the caches live in the temporary
# folder too (XDG_CACHE_HOME), and the aisql environment variables are unset.
#
#   scripts/fresh-clone-check.sh            # cold: a new target dir (~20 min on 2 cores)
#   FRESH_CLONE_TARGET_DIR=DIR scripts/fresh-clone-check.sh   # reuse a target dir
#   KEEP=1 scripts/fresh-clone-check.sh     # keep the temporary folder
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/aisql-fresh.XXXXXX")"
[[ "${KEEP:-0}" == 1 ]] || trap 'rm -rf "$WORK"' EXIT
step() { echo "== $(date -u +%H:%M:%S) $*"; }

unset AISQL_QUAILB_PLANS AISQL_ROOT AISQL_MODEL AISQL_CACHE_DIR CARGO_TARGET_DIR PROTOC
export XDG_CACHE_HOME="$WORK/cache"
export CARGO_TARGET_DIR="${FRESH_CLONE_TARGET_DIR:-$WORK/target}"
export CARGO_TERM_COLOR=never

step "clone $(git -C "$ROOT" rev-parse --short HEAD) into $WORK/aisql (nothing beside it)"
git clone --quiet --no-local "$ROOT" "$WORK/aisql"
ls -A "$WORK"
cd "$WORK/aisql"

step "build: cargo build --release (target dir $CARGO_TARGET_DIR)"
start=$(date +%s)
cargo build --release --quiet --bin aisql
echo "build: $(( $(date +%s) - start )) s"
AISQL="$CARGO_TARGET_DIR/release/aisql"

step "README quick bench, from another folder: aisql bench --sf 0.01 --queries IMDB-1,FEV-1"
mkdir -p "$WORK/elsewhere" && cd "$WORK/elsewhere"
start=$(date +%s)
"$AISQL" bench --sf 0.01 --queries IMDB-1,FEV-1 --cpu --output-dir "$WORK/elsewhere/run"
echo "bench: $(( $(date +%s) - start )) s"
python3 - "$WORK/elsewhere/run/run.json" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
print("run.json:", run["status"], "|", run["metadata"].get("plans"), "|", run["metadata"].get("model"))
for q in run["queries"]:
    m = q.get("metrics") or {}
    acc = (m.get("accuracy") or {}).get("answer_accuracy") or {}
    print(f'  {q["id"]}: {q["status"]}, fresh tokens {m.get("fresh_tokens")}, '
          f'KV regret {m.get("kv_regret_percent")} %, answers correct {acc.get("correct")}/{acc.get("evaluated")}')
PY
"$AISQL" explain IMDB-7 | head -n 3

step "one test binary: cargo test --release --test self_contained"
cd "$WORK/aisql"
cargo test --release --quiet --test self_contained 2>&1 | grep -E '^test result|passed|failed|panicked' || true
cargo test --release --quiet --test self_contained >/dev/null 2>&1
step "fresh clone check passed"
