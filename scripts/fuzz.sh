#!/usr/bin/env bash
# Fuzzes one aisql front end.
#
#   scripts/fuzz.sh TARGET SECONDS [--seed N]     structure-aware generation over
#                                                 real seeds (aisql-fuzz, no
#                                                 instrumentation)
#   scripts/fuzz.sh --coverage TARGET SECONDS     coverage-guided: libFuzzer over an
#                                                 instrumented build (stable Rust,
#                                                 SanitizerCoverage; target/libfuzzer)
#
# TARGET: substrait, parquet, csv, manifest, labels, resume, prompt (or all, for the
# first form). Findings land in fuzz/artifacts/TARGET/ (crash-*, violation-*,
# hang-*, timeout-*, oom-*); once fixed, copy one into fuzz/regressions/TARGET/ and
# `cargo test` replays it. libFuzzer's growing corpus is kept in fuzz/corpus/TARGET/.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
target_dir="${CARGO_TARGET_DIR:-target}"

if [ "${1:-}" = "--coverage" ]; then
  [ $# -eq 3 ] || usage
  target="$2"; seconds="$3"
  cargo build --quiet -p aisql-fuzz --bin aisql-fuzz
  corpus="fuzz/corpus/$target"
  mkdir -p "$corpus" "fuzz/artifacts/$target"
  "$target_dir/debug/aisql-fuzz" "$target" seeds "$corpus" >/dev/null
  triple="$(rustc -vV | sed -n 's/^host: //p')"
  flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
  flags="$flags -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
  flags="$flags -Cllvm-args=-sanitizer-coverage-pc-table"
  flags="$flags -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
  # --target keeps the instrumentation off build scripts and proc macros.
  (cd fuzz/libfuzzer && RUSTFLAGS="$flags" CARGO_TARGET_DIR="$PWD/../../$target_dir/libfuzzer" \
    cargo build --quiet --target "$triple")
  # -timeout: a hang is 10 s; -malloc_limit_mb: no allocation over 4 GiB.
  AISQL_FUZZ_TARGET="$target" RUST_BACKTRACE=0 \
    "$target_dir/libfuzzer/$triple/debug/aisql-fuzz-libfuzzer" "$corpus" \
    -max_total_time="$seconds" -timeout=10 -malloc_limit_mb=4096 -rss_limit_mb=8192 \
    -max_len=1048576 -artifact_prefix="fuzz/artifacts/$target/" -print_final_stats=1
  exit $?
fi

[ $# -ge 2 ] || usage
cargo build --quiet -p aisql-fuzz --bin aisql-fuzz
status=0
"$target_dir/debug/aisql-fuzz" "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 2 ]; then
  echo "fuzz: exit $status; inputs are in fuzz/artifacts/$1/ (current-input is the one that was running)" >&2
fi
exit "$status"
