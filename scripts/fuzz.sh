#!/usr/bin/env bash
# Fuzzes one aisql front end: scripts/fuzz.sh TARGET SECONDS [--seed N]
# TARGET: substrait, parquet, csv, manifest, labels, resume, prompt, or all.
# Findings are saved under fuzz/artifacts/TARGET/ (crash-*, violation-*, hang-*);
# copy one into fuzz/regressions/TARGET/ once fixed, and `cargo test` replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: scripts/fuzz.sh TARGET SECONDS [--seed N]" >&2
  exit 2
fi
cargo build --quiet -p aisql-fuzz --bin aisql-fuzz
target_dir="${CARGO_TARGET_DIR:-target}"
status=0
"$target_dir/debug/aisql-fuzz" "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 2 ]; then
  echo "fuzz: exit $status; inputs are in fuzz/artifacts/$1/ (current-input is the one that was running)" >&2
fi
exit "$status"
