#!/usr/bin/env bash
# Single-stream speed of tpslab against llama.cpp's llama-bench on the same file, machine and
# thread count, run back to back so both see the same machine state.
#   LLAMA_BIN=/path/to/llama.cpp/build/bin tests/bench/bench-vs-llamacpp.sh [MODEL.gguf]
# llama.cpp is not part of this repo: build it yourself (any recent release) and point LLAMA_BIN
# at its bin/ folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${LLAMA_BIN:?set LLAMA_BIN to a llama.cpp build/bin folder}"
THREADS=${THREADS:-2}
REPS=${REPS:-5}
cargo build --release -q
MODEL=${1:-$(./target/release/tpslab generate --model default --prompt x --max-tokens 1 --json >/dev/null && echo "${TPSLAB_HOME:-$HOME/.local/share/tpslab}/models/SmolLM2-135M-Instruct.Q4_1.gguf")}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## tpslab bench --pp 128,512 --tg 128 --reps $REPS --threads $THREADS"
/usr/bin/time -f "peak RSS %M KiB" ./target/release/tpslab bench --model "$MODEL" --pp 128,512 --tg 128 --reps "$REPS" --threads "$THREADS"
echo "## llama-bench -p 128,512 -n 128 -r $REPS -t $THREADS"
/usr/bin/time -f "peak RSS %M KiB" "$LLAMA_BIN/llama-bench" -m "$MODEL" -p 128,512 -n 128 -r "$REPS" -t "$THREADS"
