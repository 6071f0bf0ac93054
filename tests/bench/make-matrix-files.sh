#!/usr/bin/env bash
# The files of issue 42's matrix: random weights in a Llama-3.2-1B shape and a SmolLM2-360M shape
# (width 960, so llama-quantize's K-quant presets fall back per tensor), F16 from
# tests/bench/make-llama1b-gguf.py, then each preset quantized by llama.cpp's own llama-quantize:
#   tests/bench/make-matrix-files.sh OUT_DIR
# Needs the reference build with llama-quantize (`../shared/reference/build-llamacpp.sh
# llama-quantize`; LLAMA_CPP_DIR as there) and numpy, pyyaml for gguf-py. Writes
# OUT_DIR/{l1b,s360}.{q4_k_m,q5_k_m,q6_k,q8_0,iq4_xs}.gguf (files already there are kept), which
# tests/bench/cpu-vs-llamacpp.sh then times with MODEL="OUT_DIR/*.gguf". PRESETS overrides the
# list; TOKENIZER_FROM the GGUF whose tokenizer the files copy (default: the default model).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?usage: make-matrix-files.sh OUT_DIR}
LLAMA=${LLAMA_CPP_DIR:-/tmp/llama-cpp-ref}/llama.cpp
QUANTIZE=$LLAMA/build/bin/llama-quantize
[ -x "$QUANTIZE" ] || { echo "no $QUANTIZE (run build-llamacpp.sh llama-quantize)" >&2; exit 2; }
TOK=${TOKENIZER_FROM:-${TPSLAB_HOME:-$HOME/.local/share/tpslab}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$TOK" ] || { echo "no $TOK (run: tpslab generate --model default ... once)" >&2; exit 2; }
PRESETS=${PRESETS:-"Q4_K_M Q5_K_M Q6_K Q8_0 IQ4_XS"}
mkdir -p "$OUT"
for shape in l1b:llama-3.2-1b s360:smollm2-360m; do
  name=${shape%%:*}
  f16=$OUT/$name.f16.gguf
  [ -f "$f16" ] || python3 "$HERE/tests/bench/make-llama1b-gguf.py" --gguf-py "$LLAMA/gguf-py" \
    --tokenizer-from "$TOK" --shape "${shape#*:}" "$f16"
  for t in $PRESETS; do
    out=$OUT/$name.$(echo "$t" | tr 'A-Z' 'a-z').gguf
    [ -f "$out" ] || "$QUANTIZE" "$f16" "$out" "$t" 2 >"$out.log" 2>&1 || { tail -5 "$out.log" >&2; exit 1; }
    echo "$out"
  done
done
