#!/usr/bin/env bash
# Compiles kernels/cuda/*.cu to PTX (compute_80: the driver JITs it for Ampere and Hopper) into
# kernels/ptx/, which is committed and embedded in the binary, so building TPS Lab needs no CUDA
# toolkit. Needs nvcc 13.0 (the H200's 580 driver accepts PTX ISA up to 9.0): either on PATH or
# fetched from PyPI wheels into $CUDA_PREFIX (default /tmp/cuda-prefix) with --fetch.
#
#   kernels/cuda/build-ptx.sh [--fetch] [--check] [--ptxas]
#   --check: compile into a temporary folder and fail if the committed PTX differs.
#   --ptxas: also assemble the committed PTX for sm_90 (the H200) and print each kernel's
#            registers, spills and shared memory: what the driver's JIT will face, without a GPU.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/../ptx"
prefix="${CUDA_PREFIX:-/tmp/cuda-prefix}"
check=0
ptxas=0
for a in "$@"; do
  case "$a" in
    --fetch)
      wheels="$(mktemp -d)"
      python3 -m pip download -q --no-deps -d "$wheels" nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 \
        nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
      python3 -m pip install -q --no-deps --no-index --target "$prefix" "$wheels"/*.whl
      ;;
    --check) check=1 ;;
    --ptxas) ptxas=1 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done
if ! command -v nvcc >/dev/null && [ -x "$prefix/nvidia/cu13/bin/nvcc" ]; then
  export CUDA_HOME="$prefix/nvidia/cu13" PATH="$prefix/nvidia/cu13/bin:$PATH"
fi
command -v nvcc >/dev/null || { echo "nvcc not found (try --fetch)" >&2; exit 3; }
nvcc --version | grep -q "release 13.0" || { echo "need nvcc 13.0, found: $(nvcc --version | tail -1)" >&2; exit 3; }
if [ $check = 1 ]; then out="$(mktemp -d)"; fi
for f in "$here"/*.cu; do
  name="$(basename "$f" .cu)"
  nvcc -arch=compute_80 -ptx -O3 -o "$out/$name.ptx.tmp" "$f"
  # Drop the compiler's build stamp lines so the output depends on the sources alone.
  grep -v '^// Compiler Build ID\|^// Cuda compilation tools\|^// Based on NVVM' "$out/$name.ptx.tmp" > "$out/$name.ptx"
  rm "$out/$name.ptx.tmp"
done
if [ $check = 1 ]; then
  diff -q "$out" "$here/../ptx" && echo "committed PTX matches the sources"
fi
if [ $ptxas = 1 ]; then
  for f in "$here"/../ptx/*.ptx; do
    ptxas -arch=sm_90 -v "$f" -o /dev/null 2>&1 |
      sed -nE "s/.*Compiling entry function '([A-Za-z_0-9]+)'.*/\1/p; s/.*[^0-9]([0-9]+ bytes stack frame.*)/  \1/p; s/.*Used (.*)/  used \1/p" |
      paste - - -
  done
fi
