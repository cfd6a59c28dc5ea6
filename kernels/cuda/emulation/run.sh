#!/bin/bash
# Host emulation of kernels/cuda/aisql_kernels.cu (compiled unchanged), with sanitizers:
#   ./run.sh              plain -O1 build (all cases), ASan+UBSan build (all cases),
#                         TSan build (quick subset: races on shared memory = a missing
#                         __syncthreads)
#   FULL_TSAN=1 ./run.sh  every case under TSan (~8 min on 2 cores)
# Binaries and logs go to $EMU_OUT (default: a new temporary folder).
set -u
cd "$(dirname "$0")"
OUT="${EMU_OUT:-$(mktemp -d)}"; mkdir -p "$OUT"
CXX="${CXX:-g++} -std=c++20 -O1 -Wall -Wno-unknown-pragmas -I$PWD/shim -pthread"
rc=0
echo "== plain build ($OUT)"; $CXX harness.cpp -o "$OUT/harness" && "$OUT/harness" || rc=1
echo "== ASan+UBSan build"
$CXX -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined harness.cpp -o "$OUT/harness_asan" \
  && "$OUT/harness_asan" > "$OUT/asan.log" 2>&1 || rc=1
grep -E "ERROR|runtime error" "$OUT/asan.log" || echo "ASan/UBSan: clean ($(tail -1 "$OUT/asan.log"))"
echo "== TSan build"
$CXX -g -fsanitize=thread harness.cpp -o "$OUT/harness_tsan" || rc=1
if [ "${FULL_TSAN:-0}" = 1 ]; then "$OUT/harness_tsan" > "$OUT/tsan.log" 2>&1 || rc=1
else "$OUT/harness_tsan" quick > "$OUT/tsan.log" 2>&1 || rc=1; fi
echo "TSan warnings: $(grep -c "WARNING: ThreadSanitizer" "$OUT/tsan.log")"; tail -1 "$OUT/tsan.log"
exit $rc
