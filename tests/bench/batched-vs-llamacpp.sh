#!/usr/bin/env bash
# Batched (serving) speed of tpslab against llama.cpp's llama-batched-bench on the same file,
# machine and thread count: prompt 128, output 128, 1/4/16/64 sequences, back to back.
#   LLAMA_BIN=/path/to/llama.cpp/build/bin tests/bench/batched-vs-llamacpp.sh [MODEL.gguf]
# llama.cpp is not part of this repo: build it yourself and point LLAMA_BIN at its bin/ folder.
# Compare like with like: llama-batched-bench's whole-run output rate is B*TG/T (its T includes
# prefill), our `output_throughput`; its decode-only S_TG is our `decode_throughput`.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${LLAMA_BIN:?set LLAMA_BIN to a llama.cpp build/bin folder}"
THREADS=${THREADS:-2}
LEVELS=${LEVELS:-1,4,16,64}
cargo build --release -q
MODEL=${1:-$(./target/release/tpslab generate --model default --prompt x --max-tokens 1 --json >/dev/null && echo "${TPSLAB_HOME:-$HOME/.local/share/tpslab}/models/SmolLM2-135M-Instruct.Q4_1.gguf")}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## tpslab bench --concurrency $LEVELS --prompt-len 128 --output-len 128 --threads $THREADS"
./target/release/tpslab bench --model "$MODEL" --concurrency "$LEVELS" --prompt-len 128 --output-len 128 \
  --threads "$THREADS" --json "${OUT_JSON:-/tmp/tpslab-batched.json}"
echo "## llama-batched-bench -npp 128 -ntg 128 -npl $LEVELS -t $THREADS"
"$LLAMA_BIN/llama-batched-bench" -m "$MODEL" -c 20000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl "$LEVELS" \
  -t "$THREADS" 2>&1 | grep -E '^\|'
