#!/usr/bin/env bash
# Installs a project-local CUDA 13.0 toolkit (matches the H200 machine's 580 driver) (nvcc, headers, cudart, cublas,
# cublasLt, curand, nvrtc) from NVIDIA's PyPI wheels into .cuda/ (git-ignored),
# plus a link-time stub libcuda.so (the real one comes from the GPU driver),
# and prints the environment to build `--features cuda` with.
#
#   scripts/cuda-toolchain.sh            # install (idempotent) and print env
#   eval "$(scripts/cuda-toolchain.sh --env)"   # just print/apply env
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${AISQL_CUDA_DIR:-$ROOT/.cuda}"
SITE="$DIR/site"
HOME_="$DIR/home"

print_env() {
  cat <<ENV
export CUDA_HOME="$HOME_"
export CUDA_PATH="$HOME_"
export NVCC="$HOME_/bin/nvcc"
export PATH="$HOME_/bin:\$PATH"
export LIBRARY_PATH="$HOME_/lib64:$HOME_/lib64/stubs\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$HOME_/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CUDA_COMPUTE_CAP=90
export CUDARC_CUDA_VERSION=13000
ENV
}
if [[ "${1:-}" == "--env" ]]; then print_env; exit 0; fi

PKGS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-nvrtc==13.0.88
  nvidia-cublas==13.0.2.14
  nvidia-curand==10.4.0.35
)
if [[ ! -f "$SITE/.done" ]]; then
  mkdir -p "$SITE"
  python3 -m pip install --quiet ${AISQL_CUDA_WHEELS:+--no-index --find-links "$AISQL_CUDA_WHEELS"} --no-deps --no-compile --upgrade --target "$SITE" "${PKGS[@]}"
  touch "$SITE/.done"
fi

# The CUDA 13 wheels all unpack into one toolkit tree: nvidia/cu13/{bin,include,lib,nvvm}.
CU="$SITE/nvidia/cu13"
chmod +x "$CU"/bin/* "$CU"/nvvm/bin/* 2>/dev/null || true
rm -rf "$HOME_"; mkdir -p "$DIR"; ln -sfn "$CU" "$HOME_"
[[ -e "$CU/lib64" ]] || ln -sfn lib "$CU/lib64"
mkdir -p "$CU/lib/stubs"
# Unversioned .so names for the linker (-lcudart -lcublas ...).
cd "$CU/lib"
for f in lib*.so.*; do
  base="${f%%.so.*}.so"
  [[ -e "$base" ]] || ln -sf "$f" "$base"
done
# Link-time stub for libcuda (driver API): every cu* symbol cudarc's driver
# bindings name, as an empty function, soname libcuda.so.1. At run time the
# driver's real libcuda.so.1 is loaded instead.
SYS="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src/driver/sys 2>/dev/null | tail -1 || true)"
if [[ -n "$SYS" ]]; then
  grep -rhoE 'fn cu[A-Za-z0-9_]+' "$SYS" | awk '{print $2}' | sort -u \
    | awk '{print "void " $1 "(void){}"}' > "$DIR/cuda_stub.c"
else
  echo "warning: cudarc sources not in cargo registry; run 'cargo fetch' first for a complete stub" >&2
  printf 'void cuInit(void){}\n' > "$DIR/cuda_stub.c"
fi
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CU/lib/stubs/libcuda.so" "$DIR/cuda_stub.c"
"$HOME_/bin/nvcc" --version | tail -2 >&2
echo "# CUDA toolkit ready in $HOME_. Build environment:" >&2
print_env
