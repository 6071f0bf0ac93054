#!/usr/bin/env bash
# What a quantized KV cache buys (issue 45): one KV budget, each cache type at the concurrency
# that budget holds of it (and f16's concurrency again for the same-load cost), aggregate output
# TPS and TTFT from `tpslab bench`, plus perplexity and KL against f16 KV on the bundled text.
#
#   TPS=target/release/tpslab MODEL=file.gguf BUDGET_MB=64 PROMPT=128 OUTPUT=128 \
#     tests/bench/kv-types.sh
#
# The concurrency each type fits: the pool's blocks (from `bench`'s own start line) over the
# blocks of one request, the same rule as the dashboard's line.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/machine.sh
TPS="${TPS:-target/release/tpslab}"
MODEL="${MODEL:-default}"
BUDGET_MB="${BUDGET_MB:-64}"
PROMPT="${PROMPT:-128}"
OUTPUT="${OUTPUT:-128}"
THREADS="${THREADS:-2}"
PPL_CTX="${PPL_CTX:-256}"
machine_lines
echo "# $TPS bench --model $MODEL --kv-budget-mb $BUDGET_MB --prompt-len $PROMPT --output-len $OUTPUT --threads $THREADS --device cpu"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The pool's blocks for a type, from the engine's own start line ("KV pool: N blocks of 16").
blocks_of() {
  "$TPS" bench --model "$MODEL" --kv-budget-mb "$BUDGET_MB" --device cpu --threads "$THREADS" \
    -ctk "$1" -ctv "$1" --concurrency 1 --num-requests 1 --prompt-len 8 --output-len 1 2>&1 |
    sed -n 's/.*KV pool: \([0-9]*\) blocks of \([0-9]*\).*/\1 \2/p' | head -1
}
per_request_blocks=$(( (PROMPT + OUTPUT + 15) / 16 ))
declare -A fit
for t in f16 q8_0 q4_0; do
  read -r blocks bs < <(blocks_of "$t")
  fit[$t]=$(( blocks / per_request_blocks ))
  echo "# $t: $blocks blocks of $bs tokens, $(( blocks * bs )) tokens: ${fit[$t]} requests of $((PROMPT + OUTPUT)) tokens"
done
echo "| KV type | concurrency | aggregate output tok/s | decode-only tok/s | per-request tok/s | TTFT mean ms |"
echo "|---|---|---|---|---|---|"
run() {
  local t=$1 c=$2
  "$TPS" bench --model "$MODEL" --kv-budget-mb "$BUDGET_MB" --device cpu --threads "$THREADS" \
    -ctk "$t" -ctv "$t" --concurrency "$c" --max-num-seqs "$c" --prompt-len "$PROMPT" \
    --output-len "$OUTPUT" --json "$out/$t-$c.json" >/dev/null 2>&1
  python3 - "$out/$t-$c.json" "$t" "$c" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["runs"][0]
assert s["completed"] == int(sys.argv[3]) and s["failed"] == 0, s
print(f"| {sys.argv[2]} | {sys.argv[3]} | {s['output_throughput']:.1f} | {s['decode_throughput']:.1f} | {s['mean_per_request_tps']:.2f} | {s['mean_ttft_ms']:.0f} |")
PY
}
for t in f16 q8_0 q4_0; do
  run "$t" "${fit[f16]}"
  [ "$t" = f16 ] || run "$t" "${fit[$t]}"
done
echo
for t in q8_0 q4_0; do
  echo "# $TPS perplexity $MODEL --ctx $PPL_CTX -ctk $t -ctv $t --kl-base $MODEL"
  "$TPS" perplexity "$MODEL" --ctx "$PPL_CTX" --threads "$THREADS" -ctk "$t" -ctv "$t" \
    --kl-base "$MODEL" 2>/dev/null | grep -E 'Mean PPL|Mean    KLD|Same top'
done
